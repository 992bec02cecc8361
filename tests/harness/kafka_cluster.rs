//! A real 3-node Apache Kafka cluster (KRaft, combined broker+controller
//! nodes) for fault tests, run through `scripts/kafka.sh cluster-start`:
//! replication factor 3 and `min.insync.replicas` 2 for every topic, the
//! brokers' default session timeout (9 s), and `controller.socket.timeout.ms`
//! at 5 s as docs/operations.md advises ("The active controller cut off").
//!
//! Start one per test module (a `OnceLock` in the module) and let the
//! tests take turns: a cluster start takes 15 s and three JVMs. As with the
//! shared broker, the script's watchdog stops it when the test process
//! exits. Run as root, each node lives in its own network namespace, so
//! [`KafkaCluster::cut`] can black-hole one node from everyone.
//!
//! All methods block (seconds); from an async test wrap them in
//! `tokio::task::block_in_place`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

/// The brokers' `broker.session.timeout.ms` (Kafka's default, left alone):
/// how long a broker that stopped answering still counts as alive.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(9);

/// The brokers' `controller.socket.timeout.ms` (scripts/kafka.sh sets it;
/// Kafka's default is 30 s): how long a broker's request to a controller
/// that stopped answering waits before it goes to the one elected since.
pub const CONTROLLER_SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

pub struct KafkaCluster {
    dir: tempfile::TempDir,
    bootstrap: String,
    nodes: Vec<i32>,
}

/// (topic, partition) → (leader, replicas, in-sync replicas).
pub type Layout = BTreeMap<(String, i32), (i32, Vec<i32>, Vec<i32>)>;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka.sh")
}

/// Runs `scripts/kafka.sh ARGS`; returns the last line of stdout, panics
/// with all output on failure.
fn run_script(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .env("KAFKA_PARENT_PID", std::process::id().to_string())
        .env("KAFKA_WATCHDOG_RMDIR", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/kafka.sh {} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .trim()
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string()
}

impl KafkaCluster {
    /// Starts three nodes in a fresh temp dir and waits until all are ready.
    pub fn start() -> KafkaCluster {
        let dir = tempfile::Builder::new()
            .prefix("outboxd-kafka-cluster-")
            .tempdir()
            .expect("temp dir for the kafka cluster");
        let bootstrap = run_script(&["cluster-start", dir.path().to_str().unwrap()]);
        let nodes: Vec<i32> = (1..=bootstrap.split(',').count() as i32).collect();
        assert_eq!(nodes.len(), 3, "unexpected bootstrap list {bootstrap:?}");
        let cluster = KafkaCluster {
            dir,
            bootstrap,
            nodes,
        };
        cluster.wait_full_isr(Duration::from_secs(60));
        cluster
    }

    /// `host:port,host:port,host:port`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    pub fn nodes(&self) -> &[i32] {
        &self.nodes
    }

    fn node_dir(&self, node: i32) -> PathBuf {
        self.dir.path().join(format!("node-{node}"))
    }

    fn node_arg(&self, node: i32) -> String {
        self.node_dir(node).to_str().unwrap().to_string()
    }

    /// The node's JVM pid, if it runs.
    pub fn pid(&self, node: i32) -> Option<u32> {
        std::fs::read_to_string(self.node_dir(node).join("kafka.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
            .filter(|&pid| alive(pid))
    }

    /// The node's log (every start appended), for failure messages.
    pub fn log(&self, node: i32) -> String {
        std::fs::read_to_string(self.node_dir(node).join("kafka.log")).unwrap_or_default()
    }

    /// SIGTERM: a controlled shutdown (leaders move away first); returns
    /// once the JVM is gone.
    pub fn stop(&self, node: i32) {
        run_script(&["stop", &self.node_arg(node)]);
    }

    /// SIGKILL: a crash, no controlled shutdown; returns once it is gone.
    pub fn kill(&self, node: i32) {
        let Some(pid) = self.pid(node) else { return };
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a stopped or killed node again on its address and data, and
    /// waits until it is ready (it may still be catching up: see
    /// [`wait_full_isr`](Self::wait_full_isr)).
    pub fn start_node(&self, node: i32) {
        assert!(self.pid(node).is_none(), "node {node} is running");
        run_script(&["start", &self.node_arg(node)]);
    }

    /// From now on every packet to or from the node is dropped: its
    /// connections stay open, nothing is refused (a dead switch).
    pub fn cut(&self, node: i32) {
        run_script(&["cut", &self.node_arg(node)]);
    }

    pub fn heal(&self, node: i32) {
        run_script(&["heal", &self.node_arg(node)]);
    }

    /// Every node running and reachable, every partition with its replicas
    /// all in sync: the state each test starts from, whatever the previous
    /// one left behind.
    pub fn restore(&self) {
        for &node in &self.nodes {
            self.heal(node);
            if self.pid(node).is_none() {
                self.start_node(node);
            }
        }
        self.wait_full_isr(Duration::from_secs(120));
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("socket.timeout.ms", "10000")
            .create()
            .expect("kafka admin client")
    }

    /// Every partition of every topic as the metadata says now (internal
    /// topics included); `None` without an answer.
    pub fn layout(&self) -> Option<Layout> {
        let admin = self.admin();
        let md = admin
            .inner()
            .fetch_metadata(None, Duration::from_secs(10))
            .ok()?;
        let mut out = Layout::new();
        for t in md.topics() {
            if t.error().is_some() {
                return None;
            }
            for p in t.partitions() {
                out.insert(
                    (t.name().to_string(), p.id()),
                    (p.leader(), p.replicas().to_vec(), p.isr().to_vec()),
                );
            }
        }
        Some(out)
    }

    /// Waits until every partition has a leader and all its replicas in
    /// sync; panics after `timeout` with the partitions still short.
    pub fn wait_full_isr(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let short: Vec<String> = match self.layout() {
                Some(layout) => layout
                    .iter()
                    .filter(|(_, (leader, replicas, isr))| {
                        *leader < 0 || isr.len() < replicas.len()
                    })
                    .map(|((t, p), (leader, replicas, isr))| {
                        format!("{t}-{p} leader {leader} replicas {replicas:?} isr {isr:?}")
                    })
                    .collect(),
                None => vec!["no metadata".into()],
            };
            if short.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ISR not full after {timeout:?}: {short:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Creates `name` with the cluster's default replication (3) and
    /// `config`, and waits until every partition has all its replicas in
    /// sync.
    pub fn create_topic(&self, name: &str, partitions: i32, config: &[(&str, &str)]) {
        let admin = self.admin();
        let topic = config.iter().fold(
            NewTopic::new(name, partitions, TopicReplication::Fixed(-1)),
            |t, (k, v)| t.set(k, v),
        );
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for r in rt
            .block_on(admin.create_topics([&topic], &opts))
            .unwrap_or_else(|e| panic!("create_topics({name}): {e}"))
        {
            r.unwrap_or_else(|(t, code)| panic!("create topic {t}: {code:?}"));
        }
        self.wait_full_isr(Duration::from_secs(60));
        self.wait_known_everywhere(name, partitions, Duration::from_secs(30));
    }

    /// Waits until every node answers a metadata request with all of
    /// `topic`'s partitions: a new topic reaches each broker when it applies
    /// the controller's record, and a client that asks one that has not yet
    /// is told the topic does not exist. Says which nodes did not know it
    /// at first.
    pub fn wait_known_everywhere(&self, topic: &str, partitions: i32, timeout: Duration) {
        let started = Instant::now();
        let deadline = started + timeout;
        let mut late = Vec::new();
        for (node, address) in self.nodes.iter().zip(self.bootstrap.split(',')) {
            // A fresh client that knows only this node asks it first.
            let client: AdminClient<DefaultClientContext> = ClientConfig::new()
                .set("bootstrap.servers", address)
                .create()
                .expect("kafka admin client");
            let mut unknown = 0;
            loop {
                let known = client
                    .inner()
                    .fetch_metadata(Some(topic), Duration::from_secs(5))
                    .ok()
                    .and_then(|md| {
                        let t = md.topics().iter().find(|t| t.name() == topic)?;
                        Some(t.error().is_none() && t.partitions().len() == partitions as usize)
                    })
                    .unwrap_or(false);
                if known {
                    break;
                }
                unknown += 1;
                assert!(
                    Instant::now() < deadline,
                    "node {node} ({address}) did not know topic {topic} after {timeout:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            if unknown > 0 {
                late.push(format!("node {node} ({unknown} answers without it)"));
            }
        }
        if !late.is_empty() {
            eprintln!(
                "topic {topic}, in sync per the metadata, was unknown to {} at first; known \
                 everywhere {:.1} s later",
                late.join(", "),
                started.elapsed().as_secs_f64()
            );
        }
    }

    /// The active KRaft controller (the quorum's leader): the leader that
    /// a majority of the nodes recorded for the newest epoch they agree on,
    /// in the `quorum-state` file each node rewrites as soon as it learns of
    /// an election. The metadata response's controller id is any broker in
    /// KRaft, not this one; `kafka-metadata-quorum.sh describe --status`
    /// knows it too, but each ask is a JVM start, seconds on a busy host.
    /// Waits (up to 30 s) while no majority agrees: an election under way.
    pub fn active_controller(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let states: Vec<Option<(i64, i32)>> =
                self.nodes.iter().map(|&n| self.quorum_state(n)).collect();
            let agreed = states
                .iter()
                .flatten()
                .filter(|(_, leader)| *leader >= 0)
                .filter(|s| states.iter().flatten().filter(|t| t == s).count() * 2 > states.len())
                .max();
            if let Some(&(_, leader)) = agreed {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no majority of the nodes agrees on a KRaft leader after 30 s: (epoch, leader) \
                 per node {states:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// (epoch, leader id) as `node` last recorded its KRaft election state
    /// (leader -1 while it knows none).
    fn quorum_state(&self, node: i32) -> Option<(i64, i32)> {
        let path = self
            .node_dir(node)
            .join("data/__cluster_metadata-0/quorum-state");
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
        Some((
            state["leaderEpoch"].as_i64()?,
            i32::try_from(state["leaderId"].as_i64()?).ok()?,
        ))
    }

    /// Partitions each node leads now.
    pub fn leader_counts(&self) -> BTreeMap<i32, usize> {
        let mut counts: BTreeMap<i32, usize> = self.nodes.iter().map(|&n| (n, 0)).collect();
        for (leader, _, _) in self.layout().unwrap_or_default().values() {
            *counts.entry(*leader).or_default() += 1;
        }
        counts
    }

    /// Runs one of Kafka's command-line tools (`class`, from the jars
    /// `scripts/kafka.sh tools` fetches) against the cluster; its stdout.
    pub fn tool(&self, class: &str, args: &[&str]) -> String {
        static CLASSPATH: OnceLock<String> = OnceLock::new();
        let classpath = CLASSPATH.get_or_init(|| run_script(&["tools"]));
        let java = std::env::var("JAVA").unwrap_or_else(|_| "java".into());
        // A tool runs for a second or so: C2 compiling then costs more than
        // it gives (`kafka-topics --list`: 0.71-1.25 s, 0.56-0.93 s with C1
        // only, 2026-12-05, load average 12); the brokers run so too
        // (scripts/kafka.sh).
        let out = Command::new(java)
            .args(["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"])
            .args(["-cp", classpath, class])
            .args(["--bootstrap-server", &self.bootstrap])
            .args(args)
            .output()
            .expect("cannot run java");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{class} {} failed ({}):\n{stdout}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// What `kafka-leader-election.sh --election-type PREFERRED
    /// --all-topic-partitions` asks, through librdkafka in this process (the
    /// tool is a JVM start, seconds on a busy host): every partition led by
    /// its first replica again. Says which partitions changed leader; panics
    /// as the tool fails, on any answer but that or "already led by it".
    pub fn elect_preferred_leaders(&self) -> String {
        use super::admin_ffi::admin_result;
        use rdkafka::bindings as rd;
        use rdkafka::error::RDKafkaErrorCode;
        use std::ffi::CStr;

        let admin = self.admin();
        let rk = admin.inner().native_ptr();
        let no_error = rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
        let not_needed = rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_ELECTION_NOT_NEEDED;
        // SAFETY: `rk` lives as long as `admin`, which outlives the block;
        // the request, options, queue and event are destroyed once each,
        // after their last use; the result's array and the partitions and
        // errors it points to belong to the event and are read before it is
        // destroyed. A null partition list asks for every partition (the
        // request then carries none, as the tool's does).
        let outcome: Result<Vec<String>, String> = unsafe {
            let elect = rd::rd_kafka_ElectLeaders_new(
                rd::rd_kafka_ElectionType_t::RD_KAFKA_ELECTION_TYPE_PREFERRED,
                std::ptr::null_mut(),
            );
            let options = rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_ELECTLEADERS,
            );
            let mut errstr = [0 as std::ffi::c_char; 512];
            rd::rd_kafka_AdminOptions_set_operation_timeout(
                options,
                30_000,
                errstr.as_mut_ptr(),
                errstr.len(),
            );
            let outcome = admin_result(
                rk,
                "ElectLeaders",
                60_000,
                |queue| rd::rd_kafka_ElectLeaders(rk, elect, options, queue),
                |event| {
                    let result = rd::rd_kafka_event_ElectLeaders_result(event);
                    let mut n = 0;
                    let partitions = rd::rd_kafka_ElectLeaders_result_partitions(result, &mut n);
                    let (mut elected, mut failed) = (Vec::new(), Vec::new());
                    for i in 0..n {
                        let r = *partitions.add(i);
                        let tp = &*rd::rd_kafka_topic_partition_result_partition(r);
                        let name = format!(
                            "{}-{}",
                            CStr::from_ptr(tp.topic).to_string_lossy(),
                            tp.partition
                        );
                        let error = rd::rd_kafka_topic_partition_result_error(r);
                        let code = if error.is_null() {
                            no_error
                        } else {
                            rd::rd_kafka_error_code(error)
                        };
                        if code == no_error {
                            elected.push(name);
                        } else if code != not_needed {
                            failed.push(format!("{name}: {:?}", RDKafkaErrorCode::from(code)));
                        }
                    }
                    if failed.is_empty() {
                        Ok(elected)
                    } else {
                        Err(failed.join(", "))
                    }
                },
            );
            rd::rd_kafka_AdminOptions_destroy(options);
            rd::rd_kafka_ElectLeaders_destroy(elect);
            outcome
        };
        let elected = outcome.unwrap_or_else(|e| panic!("preferred-leader election: {e}"));
        format!(
            "{} partitions now led by their preferred replica: {}",
            elected.len(),
            elected.join(", ")
        )
    }

    /// `kafka-reassign-partitions.sh --execute` of `replicas` per (topic,
    /// partition), then waits (up to `timeout`) until the metadata shows
    /// each partition on exactly those replicas, all in sync: what
    /// `--verify` would say, without a JVM start per look.
    pub fn reassign(&self, replicas: &[((String, i32), Vec<i32>)], timeout: Duration) {
        let partitions: Vec<String> = replicas
            .iter()
            .map(|((t, p), r)| {
                format!(
                    "{{\"topic\":\"{t}\",\"partition\":{p},\"replicas\":[{}]}}",
                    r.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
                )
            })
            .collect();
        let plan = self
            .dir
            .path()
            .join(format!("reassign-{}.json", uuid::Uuid::new_v4().simple()));
        std::fs::write(
            &plan,
            format!(
                "{{\"version\":1,\"partitions\":[{}]}}",
                partitions.join(",")
            ),
        )
        .unwrap();
        self.tool(
            "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
            &[
                "--execute",
                "--reassignment-json-file",
                plan.to_str().unwrap(),
            ],
        );
        let deadline = Instant::now() + timeout;
        loop {
            let layout = self.layout();
            let pending: Vec<String> = replicas
                .iter()
                .filter(|(tp, want)| {
                    let now = layout.as_ref().and_then(|l| l.get(tp));
                    !now.is_some_and(|(_, replicas, isr)| {
                        replicas == want && isr.len() == want.len()
                    })
                })
                .map(|((t, p), want)| {
                    let now = layout.as_ref().and_then(|l| l.get(&(t.clone(), *p)));
                    format!("{t}-{p} wanted {want:?}, now (leader, replicas, isr) {now:?}")
                })
                .collect();
            if pending.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "reassignment not done after {timeout:?}: {pending:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["cluster-stop", self.dir.path().to_str().unwrap()])
            .output();
    }
}

/// Exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next()),
            Some(Some('Z' | 'X'))
        ),
        Err(_) => false,
    }
}
