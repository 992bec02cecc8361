//! A real single-node Apache Kafka broker (KRaft) for integration tests, run through
//! `scripts/kafka.sh`.
//!
//! * [`shared()`] — one broker per test binary, started on first use. Use unique topic names.
//!   Never pause/kill/restart it (the accessor only hands out `&`, so you can't restart it).
//! * [`KafkaBroker::start()`] — a private broker for fault tests (pause, kill, restart);
//!   stopped when dropped, also when the test panics.
//!
//! All methods block the calling thread (seconds, for start/restart/consume_all). From an async
//! test on a multi-thread runtime wrap them in `tokio::task::block_in_place`, or use
//! `spawn_blocking`, so the code under test keeps running meanwhile.
//!
//! Every broker is also watched by a small shell loop started by the script: when the test
//! process exits without dropping it (the shared broker, panic=abort, SIGKILL) the loop stops
//! the JVM within ~1 s (+ shutdown) and removes its temp dir, so no broker outlives its test
//! binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

/// One record read back from the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// In the order the producer wrote them; a null header value reads as an empty vec
    /// (see `null_headers`).
    pub headers: Vec<(String, Vec<u8>)>,
    /// Positions in `headers` of the headers whose value was null, not empty.
    pub null_headers: Vec<usize>,
    /// Milliseconds since the epoch (create or log-append time), if the broker reported one.
    pub timestamp: Option<i64>,
}

impl Record {
    pub fn key_str(&self) -> Option<&str> {
        self.key
            .as_deref()
            .map(|k| std::str::from_utf8(k).expect("key is not UTF-8"))
    }
    pub fn value_str(&self) -> Option<&str> {
        self.value
            .as_deref()
            .map(|v| std::str::from_utf8(v).expect("value is not UTF-8"))
    }
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
    /// The first header with this name: `Some(None)` when its value is null.
    pub fn header_value(&self, name: &str) -> Option<Option<&[u8]>> {
        let i = self.headers.iter().position(|(k, _)| k == name)?;
        Some((!self.null_headers.contains(&i)).then(|| self.headers[i].1.as_slice()))
    }
}

pub struct KafkaBroker {
    dir: tempfile::TempDir,
    /// Lines appended to server.properties at every start (`KAFKA_EXTRA_PROPERTIES`).
    extra: String,
    bootstrap: String,
    /// Current JVM pid (changes on restart).
    pid: u32,
    paused: AtomicBool,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka.sh")
}

/// Runs `scripts/kafka.sh ARGS`; returns trimmed stdout, panics with all output on failure.
fn run_script(args: &[&str]) -> String {
    run_script_with(args, "")
}

/// [`run_script`] with `extra` server properties (`KAFKA_EXTRA_PROPERTIES`).
fn run_script_with(args: &[&str], extra: &str) -> String {
    run_script_env(args, extra, &[])
}

/// [`run_script_with`] with further environment variables.
fn run_script_env(args: &[&str], extra: &str, vars: &[(&str, &str)]) -> String {
    let mut cmd = Command::new("bash");
    cmd.arg(script()).args(args);
    cmd.env("KAFKA_EXTRA_PROPERTIES", extra);
    cmd.envs(vars.iter().copied());
    cmd.env("KAFKA_PARENT_PID", std::process::id().to_string());
    // If this process dies without running Drop (SIGKILL, abort, or the never-dropped shared
    // broker), the script's watchdog stops the JVM and removes its temp dir.
    cmd.env("KAFKA_WATCHDOG_RMDIR", "1");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        panic!(
            "scripts/kafka.sh {} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            args.join(" "),
            out.status
        );
    }
    stdout
        .trim()
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string()
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Exists and is not a zombie (an orphaned JVM is re-parented to PID 1, which may reap late).
fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
            !matches!(state, Some(Some('Z' | 'X')))
        }
        Err(_) => false,
    }
}

fn read_pid(dir: &Path) -> u32 {
    let path = dir.join("kafka.pid");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("bad pid in {}: {e}", path.display()))
}

/// Runs a future to completion on a private runtime in its own thread, so it also works when
/// called from inside a tokio runtime (where a nested `block_on` would panic).
fn block_on<F>(f: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime")
                .block_on(f)
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// The server.properties line for a broker that a test pauses for up to
/// `pause`: its session with its controller outlasts the pause by 20 s. With
/// the harness's 3 s session the controller, frozen in the same JVM, fences
/// the broker at the resume; every partition is then without a leader for a
/// moment, and librdkafka clients, the relay's producer and the harness's
/// readers alike, can stay stuck after it ("new leader -1 not found in
/// cache"). A test of loss or order under a pause must not turn into one of a
/// fenced broker: `relay::stuck_producer` is that test.
pub fn session_outlasting(pause: Duration) -> String {
    let session = pause + Duration::from_secs(20);
    format!("broker.session.timeout.ms={}\n", session.as_millis())
}

impl KafkaBroker {
    /// Starts a private broker on a free loopback port in a fresh temp dir and waits until it
    /// is ready. Panics with the script's output if it does not come up.
    pub fn start() -> KafkaBroker {
        KafkaBroker::start_with("")
    }

    /// As [`start`](Self::start), with `extra` lines appended to the broker's
    /// server.properties (later lines win), e.g. an authorizer.
    pub fn start_with(extra: &str) -> KafkaBroker {
        KafkaBroker::start_on(None, extra, &[])
    }

    /// As [`start_with`](Self::start_with), with its controller in a JVM of
    /// its own (`KAFKA_SEPARATE_CONTROLLER`), as production runs them: a
    /// [`kill`](Self::kill) leaves the controller running, so it fences the
    /// dead broker once its session is over, and a
    /// [`restart`](Self::restart) starts only the broker. A single node that
    /// is killed takes its controller with it, and when it comes back its
    /// controller fences the killed incarnation only once that session has
    /// run out, while the restarted broker may already lead its partitions.
    pub fn start_with_own_controller(extra: &str) -> KafkaBroker {
        KafkaBroker::start_on(None, extra, &[("KAFKA_SEPARATE_CONTROLLER", "1")])
    }

    /// A broker that every client, itself included, reaches through
    /// `proxy_port` (its advertised listener), listening on `port`, where the
    /// proxy forwards.
    pub fn start_behind(proxy_port: u16, port: u16) -> KafkaBroker {
        let extra = format!("advertised.listeners=PLAINTEXT://127.0.0.1:{proxy_port}\n");
        let mut broker = KafkaBroker::start_on(Some(port), &extra, &[]);
        broker.bootstrap = format!("127.0.0.1:{proxy_port}");
        broker
    }

    /// As [`start_behind`](Self::start_behind), but the broker's own
    /// connections (to itself, for transaction markers) go to an internal
    /// listener that bypasses the proxy: what the proxy does to the
    /// clients' connections leaves the cluster itself healthy.
    pub fn start_behind_for_clients(proxy_port: u16, port: u16) -> KafkaBroker {
        let (cport, internal) = (
            crate::harness::http::free_port(),
            crate::harness::http::free_port(),
        );
        let extra = format!(
            "listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport},INTERNAL://127.0.0.1:{internal}\n\
             controller.quorum.voters=1@127.0.0.1:{cport}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{proxy_port},INTERNAL://127.0.0.1:{internal}\n\
             inter.broker.listener.name=INTERNAL\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT\n"
        );
        let mut broker = KafkaBroker::start_on(Some(port), &extra, &[]);
        broker.bootstrap = format!("127.0.0.1:{proxy_port}");
        broker
    }

    fn start_on(port: Option<u16>, extra: &str, vars: &[(&str, &str)]) -> KafkaBroker {
        let dir = tempfile::Builder::new()
            .prefix("outboxd-kafka-")
            .tempdir()
            .expect("temp dir for kafka");
        let dir_str = dir.path().to_str().expect("utf-8 temp dir").to_string();
        let port = port.map(|p| p.to_string());
        let mut args = vec!["start", dir_str.as_str()];
        args.extend(port.as_deref());
        let bootstrap = run_script_env(&args, extra, vars);
        assert!(
            bootstrap.starts_with("127.0.0.1:"),
            "unexpected output from scripts/kafka.sh start: {bootstrap:?}"
        );
        let pid = read_pid(dir.path());
        KafkaBroker {
            dir,
            extra: extra.to_owned(),
            bootstrap,
            pid,
            paused: AtomicBool::new(false),
        }
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    pub fn port(&self) -> u16 {
        self.bootstrap.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The broker's directory (server.properties, data/, kafka.log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The broker log (stdout/stderr of the JVM, all starts appended), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kafka.log")).unwrap_or_default()
    }

    /// The last `last` lines of the broker log that `keep` accepts, each cut
    /// to 400 bytes, for a failure message (the log goes with its temp dir).
    pub fn log_lines(&self, keep: impl Fn(&str) -> bool, last: usize) -> String {
        let text = self.log();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| keep(l))
            .map(|l| l.get(..400).unwrap_or(l))
            .collect();
        lines[lines.len().saturating_sub(last)..].join("\n")
    }

    /// SIGSTOP the JVM: connections stay open and the port still accepts (kernel backlog),
    /// but nothing is answered — a hung broker.
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
        self.paused.store(true, Ordering::SeqCst);
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
        self.paused.store(false, Ordering::SeqCst);
    }

    /// SIGKILL the JVM (a crash: no controlled shutdown) and wait until it is gone and its
    /// port refuses connections.
    pub fn kill(&self) {
        let pid = self.pid();
        signal(pid, "KILL");
        self.paused.store(false, Ordering::SeqCst);
        let addr: std::net::SocketAddr = self.bootstrap.parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let closed =
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err();
            if !pid_alive(pid) && closed {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the broker again on the same port and data dir and waits until it is ready
    /// (typically after [`kill`](Self::kill); a still running broker is stopped gracefully
    /// first). Acknowledged data survives: a SIGKILL loses nothing the OS page cache holds.
    pub fn restart(&mut self) {
        let dir_str = self.dir.path().to_str().unwrap().to_string();
        if pid_alive(self.pid()) {
            run_script(&["stop", &dir_str]);
        }
        self.paused.store(false, Ordering::SeqCst);
        let port = self.port().to_string();
        let bootstrap = run_script_with(&["start", &dir_str, &port], &self.extra);
        assert_eq!(
            bootstrap, self.bootstrap,
            "broker came back on another address"
        );
        self.pid = read_pid(self.dir.path());
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("socket.timeout.ms", "10000")
            .create()
            .expect("kafka admin client")
    }

    /// Creates a topic (replication factor 1) and waits until every partition has a leader.
    /// Already existing with the same partition count is fine.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        self.create_topic_with(name, partitions, &[]);
    }

    /// As [`create_topic`](Self::create_topic), with topic configs, e.g.
    /// `("message.timestamp.type", "LogAppendTime")` so each record's
    /// timestamp says when the broker appended it.
    pub fn create_topic_with(&self, name: &str, partitions: i32, config: &[(&str, &str)]) {
        let admin = self.admin();
        let opts = AdminOptions::new()
            .operation_timeout(Some(Duration::from_secs(30)))
            .request_timeout(Some(Duration::from_secs(30)));
        let topic = config.iter().fold(
            NewTopic::new(name, partitions, TopicReplication::Fixed(1)),
            |t, (k, v)| t.set(k, v),
        );
        let results = block_on(admin.create_topics([&topic], &opts))
            .unwrap_or_else(|e| panic!("create_topics({name}) failed: {e}"));
        for r in results {
            match r {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, code)) => panic!("create topic {t}: {code:?}"),
            }
        }
        // Wait until the broker's metadata has the topic with all partitions led.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let led = admin
                .inner()
                .fetch_metadata(Some(name), Duration::from_secs(5))
                .ok()
                .and_then(|md| {
                    let t = md.topics().iter().find(|t| t.name() == name)?;
                    let ok = t.error().is_none()
                        && !t.partitions().is_empty()
                        && t.partitions()
                            .iter()
                            .all(|p| p.leader() >= 0 && p.error().is_none());
                    ok.then(|| t.partitions().len())
                });
            if let Some(n) = led {
                assert_eq!(
                    n, partitions as usize,
                    "topic {name} exists with {n} partitions"
                );
                return;
            }
            if Instant::now() > deadline {
                panic!("topic {name} not ready after 30s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Deletes a topic, as an operator would (`kafka-topics.sh --delete`),
    /// and waits until the broker's metadata no longer has it.
    pub fn delete_topic(&self, name: &str) {
        let admin = self.admin();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for r in block_on(admin.delete_topics(&[name], &opts))
            .unwrap_or_else(|e| panic!("delete_topics({name}) failed: {e}"))
        {
            r.unwrap_or_else(|(t, code)| panic!("delete topic {t}: {code:?}"));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while admin
            .inner()
            .fetch_metadata(Some(name), Duration::from_secs(5))
            .ok()
            .is_some_and(|md| {
                md.topics()
                    .iter()
                    .any(|t| t.name() == name && t.error().is_none())
            })
        {
            assert!(
                Instant::now() < deadline,
                "topic {name} still there after 30s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Partition ids of `topic` (panics if it does not exist).
    pub fn partitions(&self, topic: &str) -> Vec<i32> {
        let admin = self.admin();
        let md = admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("metadata for {topic}: {e}"));
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .expect("topic in metadata");
        if let Some(e) = t.error() {
            panic!("topic {topic}: {:?}", RDKafkaErrorCode::from(e));
        }
        t.partitions().iter().map(|p| p.id()).collect()
    }

    /// How many records `topic` holds now: the sum of its partitions' high
    /// watermarks (nothing is ever deleted or compacted in these tests).
    /// 0 when the topic does not exist yet.
    pub fn record_count(&self, topic: &str) -> usize {
        self.watermarks(topic)
            .iter()
            .map(|&(_, _, high)| high.max(0) as usize)
            .sum()
    }

    /// (partition, low, high) watermarks of every partition of `topic`; the
    /// low one is the log start offset (above 0 only if records were deleted).
    pub fn watermarks(&self, topic: &str) -> Vec<(i32, i64, i64)> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", "outboxd-harness-watermarks")
            .create()
            .expect("consumer for watermarks");
        let Ok(meta) = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) else {
            return Vec::new();
        };
        let Some(t) = meta.topics().first().filter(|t| t.error().is_none()) else {
            return Vec::new();
        };
        t.partitions()
            .iter()
            .map(|p| {
                let (low, high) = consumer
                    .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                    .unwrap_or((-1, -1));
                (p.id(), low, high)
            })
            .collect()
    }

    /// Reads `topic` from the beginning of every partition (no consumer group, nothing
    /// committed, read_committed isolation) until `expected` records arrived or `timeout`
    /// passed, and returns what it got, sorted by (partition, offset). Returns at most
    /// `expected` records, so to check that there are no extras ask for `n + 1` with a short
    /// timeout and assert the length is `n`.
    pub fn consume_all(&self, topic: &str, expected: usize, timeout: Duration) -> Vec<Record> {
        let deadline = Instant::now() + timeout;
        // librdkafka wants a group.id even for assign(); a fresh one that never joins or
        // commits anything.
        static GROUP_SEQ: AtomicU32 = AtomicU32::new(0);
        let group = format!(
            "outboxd-harness-{}-{}",
            std::process::id(),
            GROUP_SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let consumer = self.reader(&group, false, 100);

        let Some(_) = assign_from_start(&consumer, topic, deadline) else {
            eprintln!(
                "consume_all({topic}): no metadata from {} in {timeout:?}",
                self.bootstrap
            );
            return Vec::new();
        };

        let mut out = Vec::with_capacity(expected);
        let mut errors = 0u32;
        while out.len() < expected {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let wait = (deadline - now).min(Duration::from_millis(200));
            match consumer.poll(wait) {
                None => {}
                Some(Ok(m)) => out.push(to_record(&m)),
                // Transient errors (e.g. the broker is restarting): keep
                // polling, but say so: a read-back that silently skipped
                // records would look like loss.
                Some(Err(e)) => {
                    errors += 1;
                    if errors <= 3 {
                        eprintln!("consume_all({topic}): {e}");
                    }
                }
            }
        }
        out.sort_by_key(|r| (r.partition, r.offset));
        out
    }
}

impl KafkaBroker {
    /// Every record of `topic` a `read_committed` consumer sees, read to the
    /// end of each partition (its last stable offset): with transactions a
    /// topic's offsets count commit markers and aborted records too, so a
    /// record count cannot say when to stop. Empty after `timeout` without
    /// metadata.
    pub fn consume_to_end(&self, topic: &str, timeout: Duration) -> Vec<Record> {
        let deadline = Instant::now() + timeout;
        let consumer = self.reader(
            &format!("outboxd-harness-end-{}", std::process::id()),
            true,
            100,
        );
        let Some(parts) = assign_from_start(&consumer, topic, deadline) else {
            return Vec::new();
        };
        let mut at_end: std::collections::HashSet<i32> = Default::default();
        let mut out = Vec::new();
        while at_end.len() < parts.len() && Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                None => {}
                Some(Ok(m)) => {
                    at_end.remove(&m.partition());
                    out.push(to_record(&m));
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    at_end.insert(p);
                }
                Some(Err(e)) => eprintln!("consume_to_end({topic}): {e}"),
            }
        }
        out.sort_by_key(|r| (r.partition, r.offset));
        out
    }
}

/// A `read_committed` consumer that stays assigned to a topic from its
/// beginning: it sees each record within a poll of its commit, where
/// reading the topic again from the start takes a second or two (a new
/// client, its metadata, its fetches). Tests that must act while the relay
/// is in a given place follow it with this.
pub struct Tail {
    consumer: BaseConsumer,
    topic: String,
}

impl KafkaBroker {
    /// A tail of `topic`; it waits up to `timeout` for the topic's metadata
    /// (the code under test may create it).
    pub fn tail(&self, topic: &str, timeout: Duration) -> Tail {
        let consumer = self.reader(
            &format!("outboxd-harness-tail-{}", std::process::id()),
            false,
            10,
        );
        assign_from_start(&consumer, topic, Instant::now() + timeout)
            .unwrap_or_else(|| panic!("tail({topic}): no metadata in {timeout:?}"));
        Tail {
            consumer,
            topic: topic.to_string(),
        }
    }
}

impl Tail {
    /// The next committed record, or `None` after `wait`.
    pub fn next(&self, wait: Duration) -> Option<Record> {
        match self.consumer.poll(wait) {
            None => None,
            Some(Ok(m)) => Some(to_record(&m)),
            Some(Err(e)) => {
                eprintln!("tail({}): {e}", self.topic);
                None
            }
        }
    }
}

impl KafkaBroker {
    /// A `read_committed` consumer that never joins its group or commits
    /// (the readers assign partitions themselves; librdkafka still wants a
    /// `group.id`), reporting each partition's end when `eof`.
    pub(crate) fn reader(&self, group: &str, eof: bool, fetch_wait_ms: u32) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", eof.to_string())
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", fetch_wait_ms.to_string())
            .create()
            .expect("kafka consumer")
    }
}

impl KafkaBroker {
    /// A producer with `transactional_id` that wrote `key` / `value` to
    /// `topic` in a transaction it leaves open (flushed: the broker holds
    /// the record), like a relay stopped between its last record and its
    /// commit. Commit or abort it to end it. Blocks.
    pub fn open_transaction(
        &self,
        transactional_id: &str,
        topic: &str,
        key: &[u8],
        value: &[u8],
    ) -> rdkafka::producer::BaseProducer {
        // librdkafka's default: the coordinator aborts it after a minute.
        self.open_transaction_for(transactional_id, topic, key, value, Duration::from_secs(60))
    }

    /// As [`open_transaction`](Self::open_transaction), with `timeout` as its
    /// `transaction.timeout.ms`: until then only an abort ends it.
    pub fn open_transaction_for(
        &self,
        transactional_id: &str,
        topic: &str,
        key: &[u8],
        value: &[u8],
        timeout: Duration,
    ) -> rdkafka::producer::BaseProducer {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("transactional.id", transactional_id)
            .set("transaction.timeout.ms", timeout.as_millis().to_string())
            .create()
            .expect("transactional producer");
        producer.init_transactions(Duration::from_secs(30)).unwrap();
        producer.begin_transaction().unwrap();
        producer
            .send(BaseRecord::to(topic).key(key).payload(value))
            .map_err(|(e, _)| e)
            .unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
        producer
    }
}

impl KafkaBroker {
    /// Runs `kafka-transactions.sh ARGS` against this broker (Kafka's
    /// `TransactionsCommand`, the jars from `scripts/kafka.sh tools`) and
    /// returns its standard output; panics with both outputs if it fails.
    pub fn transactions_command(&self, args: &[&str]) -> String {
        let classpath = run_script(&["tools"]);
        let java = std::env::var("JAVA").unwrap_or_else(|_| "java".into());
        let out = Command::new(java)
            .args([
                "-cp",
                &classpath,
                "org.apache.kafka.tools.TransactionsCommand",
            ])
            .args(["--bootstrap-server", &self.bootstrap])
            .args(args)
            .output()
            .expect("cannot run java");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kafka-transactions.sh {} failed ({}):\n{stdout}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

/// Assigns every partition of `topic` from its beginning and returns their
/// ids; `None` without metadata by `deadline`. The topic may not exist yet
/// (the code under test creates it) or the broker may be paused or
/// restarting: asked again until then.
pub(crate) fn assign_from_start(
    consumer: &BaseConsumer,
    topic: &str,
    deadline: Instant,
) -> Option<Vec<i32>> {
    let parts = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        if let Ok(md) = consumer.fetch_metadata(Some(topic), left.min(Duration::from_secs(5))) {
            let t = md.topics().iter().find(|t| t.name() == topic);
            if let Some(t) = t.filter(|t| t.error().is_none() && !t.partitions().is_empty()) {
                break t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>();
            }
        }
        std::thread::sleep(Duration::from_millis(100).min(left));
    };
    let mut tpl = TopicPartitionList::new();
    for &p in &parts {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    Some(parts)
}

pub(crate) fn to_record(m: &BorrowedMessage<'_>) -> Record {
    Record {
        topic: m.topic().to_string(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers: m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or(&[]).to_vec()))
                    .collect()
            })
            .unwrap_or_default(),
        null_headers: m
            .headers()
            .map(|hs| {
                hs.iter()
                    .enumerate()
                    .filter(|(_, h)| h.value.is_none())
                    .map(|(i, _)| i)
                    .collect()
            })
            .unwrap_or_default(),
        timestamp: m.timestamp().to_millis(),
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        if self.paused.load(Ordering::SeqCst) {
            signal(self.pid(), "CONT");
        }
        let dir = self.dir.path().to_string_lossy().to_string();
        let _ = Command::new("bash")
            .arg(script())
            .args(["stop", &dir])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        // TempDir's own Drop removes the directory.
    }
}

/// The broker shared by every test of this binary, started on first use. Never dropped: the
/// script's watchdog stops it (and removes its dir) when the test process exits.
pub fn shared() -> &'static KafkaBroker {
    static SHARED: OnceLock<KafkaBroker> = OnceLock::new();
    SHARED.get_or_init(KafkaBroker::start)
}
