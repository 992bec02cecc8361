//! The four faults of issue 38 on the 3-broker cluster, each returning
//! once the cluster is whole again (every node up and reachable, every
//! partition's replicas all in sync).

use std::time::{Duration, Instant};

use super::relays::Mode;
use crate::harness::kafka_cluster::{KafkaCluster, CONTROLLER_SOCKET_TIMEOUT, SESSION_TIMEOUT};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    ElectionAndReassignment,
    Kill,
    RollingRestart,
    Cut,
}

impl Fault {
    /// How long acks may pause, and an event wait, through the fault in
    /// `mode`: 10 s where leaders move in an orderly way, the brokers'
    /// session + 10 s where a broker vanishes without a word. Except
    /// at-least-once through the cut of the active controller: the
    /// producer the watchdog replaces there needs a new producer id, which
    /// a broker left may first have to fetch from the controller, and its
    /// request to the one cut off is given up only after the brokers'
    /// `controller.socket.timeout.ms`: one more of those (docs/operations.md,
    /// "The active controller cut off"; measured 15.8-20.4 s, 2026-12-05).
    pub(super) fn bound(self, mode: Mode) -> Duration {
        let session = SESSION_TIMEOUT + Duration::from_secs(10);
        match (self, mode) {
            (Fault::RollingRestart | Fault::ElectionAndReassignment, _) => Duration::from_secs(10),
            (Fault::Cut, Mode::AtLeastOnce) => session + CONTROLLER_SOCKET_TIMEOUT,
            (Fault::Kill | Fault::Cut, _) => session,
        }
    }

    /// Does what the fault needs beforehand: the victim is made the leader
    /// of every partition of the run and of the transaction log, so both
    /// modes meet it whatever the layout the earlier faults left. For the
    /// kill that is the transaction coordinator; for the cut, the active
    /// KRaft controller, the hard case: the brokers left then also lose
    /// their way to the controller (producer ids, ISR changes) until the
    /// quorum elects another and their channel to it gives up on the old.
    /// `prefixes` are the run's topic prefixes (its slots). Returns the
    /// victim, for [`run`](Self::run).
    pub(super) fn prepare(self, c: &KafkaCluster, prefixes: &[&str]) -> Option<i32> {
        let victim = match self {
            Fault::Kill => leader_of_transaction_log(c),
            Fault::Cut => c.active_controller(),
            Fault::RollingRestart | Fault::ElectionAndReassignment => return None,
        };
        lead_everything(c, prefixes, victim);
        Some(victim)
    }

    pub(super) fn run(self, c: &KafkaCluster, prefixes: &[&str], victim: Option<i32>) {
        match self {
            Fault::RollingRestart => {
                for &node in c.nodes() {
                    c.stop(node);
                    c.start_node(node);
                    c.wait_full_isr(Duration::from_secs(120));
                    eprintln!("rolling restart: node {node} back, ISR full");
                }
            }
            Fault::Kill => {
                let node = victim.expect("prepared");
                wait_leading(c, prefixes, node);
                c.kill(node);
                eprintln!("kill -9 of node {node} (leads the run's partitions, the ledgers', the transaction log's)");
                std::thread::sleep(Duration::from_secs(15));
                c.start_node(node);
                c.wait_full_isr(Duration::from_secs(120));
            }
            Fault::ElectionAndReassignment => {
                // Every preferred leader moves to the next replica, and
                // partition 0 of each of the run's data topics loses a
                // replica, in one reassignment; then leaders follow, and
                // those partitions get their replica back (its data copied
                // again).
                let rotated: Vec<_> = ours(c, prefixes)
                    .into_iter()
                    .map(|(tp, mut replicas)| {
                        replicas.rotate_left(1);
                        (tp, replicas)
                    })
                    .collect();
                // Partition 0 of each data topic: the transaction log has
                // one partition, which keeps its three replicas.
                let shrinks = |t: &str, p: i32| p == 0 && t != TXN_LOG;
                let first: Vec<_> = rotated
                    .iter()
                    .map(|((t, p), r)| {
                        let keep = if shrinks(t, *p) { 2 } else { r.len() };
                        ((t.clone(), *p), r[..keep].to_vec())
                    })
                    .collect();
                c.reassign(&first, Duration::from_secs(60));
                eprintln!("election: {}", c.elect_preferred_leaders().trim());
                let regrown: Vec<_> = rotated
                    .into_iter()
                    .filter(|((t, p), _)| shrinks(t, *p))
                    .collect();
                c.reassign(&regrown, Duration::from_secs(120));
                c.wait_full_isr(Duration::from_secs(120));
            }
            Fault::Cut => {
                let node = victim.expect("prepared");
                wait_leading(c, prefixes, node);
                let controller = c.active_controller();
                assert_eq!(
                    controller, node,
                    "the active controller moved before the cut"
                );
                c.cut(node);
                eprintln!("node {node} cut off for 60 s (the active controller; leads the run's partitions, the ledgers', the transaction log's)");
                std::thread::sleep(Duration::from_secs(60));
                c.heal(node);
                c.wait_full_isr(Duration::from_secs(120));
            }
        }
    }
}

const TXN_LOG: &str = "__transaction_state";

/// Waits (a few seconds at most: the election is done, its effect reaches
/// the metadata in a moment) until `node` leads every partition of the run
/// and of the transaction log.
fn wait_leading(c: &KafkaCluster, prefixes: &[&str], node: i32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let elsewhere: Vec<_> = c
            .layout()
            .expect("metadata")
            .into_iter()
            .filter(|((t, _), (leader, _, _))| *leader != node && ours_topic(t, prefixes))
            .map(|(tp, (leader, _, _))| (tp, leader))
            .collect();
        if elsewhere.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {node} should lead the run's partitions; led elsewhere: {elsewhere:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The partitions of the run's topics (data and ledgers) and of the
/// transaction log, with their replicas: the ones a fault should hit.
fn ours(c: &KafkaCluster, prefixes: &[&str]) -> Vec<((String, i32), Vec<i32>)> {
    c.layout()
        .expect("metadata")
        .into_iter()
        .filter(|((t, _), _)| ours_topic(t, prefixes))
        .map(|(tp, (_, replicas, _))| (tp, replicas))
        .collect()
}

fn ours_topic(t: &str, prefixes: &[&str]) -> bool {
    t == TXN_LOG || prefixes.iter().any(|p| t.starts_with(&format!("{p}.")))
}

/// Makes `node` the preferred (and then the actual) leader of the run's
/// partitions and of the transaction log, by reordering their replicas.
fn lead_everything(c: &KafkaCluster, prefixes: &[&str], node: i32) {
    let plan: Vec<_> = ours(c, prefixes)
        .into_iter()
        .map(|(tp, mut replicas)| {
            replicas.retain(|&r| r != node);
            replicas.insert(0, node);
            (tp, replicas)
        })
        .collect();
    c.reassign(&plan, Duration::from_secs(60));
    c.elect_preferred_leaders();
}

/// The node leading `__transaction_state` (one partition here): the
/// transaction coordinator; before any exactly-once relay made that topic,
/// the first node.
fn leader_of_transaction_log(c: &KafkaCluster) -> i32 {
    c.layout()
        .expect("metadata")
        .get(&(TXN_LOG.to_string(), 0))
        .map_or(c.nodes()[0], |(leader, _, _)| *leader)
}
