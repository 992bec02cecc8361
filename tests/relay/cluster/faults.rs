//! The four faults of issue 38 on the 3-broker cluster, each returning
//! once the cluster is whole again (every node up and reachable, every
//! partition's replicas all in sync).

use std::time::Duration;

use crate::harness::kafka_cluster::{KafkaCluster, SESSION_TIMEOUT};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    ElectionAndReassignment,
    Kill,
    RollingRestart,
    Cut,
}

impl Fault {
    /// How long acks may pause, and an event wait, through the fault: 10 s
    /// where leaders move in an orderly way, the brokers' session + 10 s
    /// where a broker vanishes without a word.
    pub(super) fn bound(self) -> Duration {
        match self {
            Fault::RollingRestart | Fault::ElectionAndReassignment => Duration::from_secs(10),
            Fault::Kill | Fault::Cut => SESSION_TIMEOUT + Duration::from_secs(10),
        }
    }

    /// Does what the fault needs beforehand: for the kill and the cut, the
    /// victim (the transaction coordinator) is made the leader of every
    /// partition of the run, so both modes meet it whatever the layout the
    /// earlier faults left. `prefixes` are the run's topic prefixes (its
    /// slots).
    pub(super) fn prepare(self, c: &KafkaCluster, prefixes: &[&str]) {
        if matches!(self, Fault::Kill | Fault::Cut) {
            lead_everything(c, prefixes, leader_of_transaction_log(c));
        }
    }

    pub(super) fn run(self, c: &KafkaCluster, prefixes: &[&str]) {
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
                let node = busiest(c);
                c.kill(node);
                eprintln!("kill -9 of node {node} (leads the run's partitions, the ledgers', the transaction log's)");
                std::thread::sleep(Duration::from_secs(15));
                c.start_node(node);
                c.wait_full_isr(Duration::from_secs(120));
            }
            Fault::ElectionAndReassignment => {
                // Every preferred leader moves to the next replica, then
                // leaders follow; then partition 0 of each of the run's topics
                // loses a replica and gets it back (its data copied again).
                let rotated: Vec<_> = ours(c, prefixes)
                    .into_iter()
                    .map(|(tp, mut replicas)| {
                        replicas.rotate_left(1);
                        (tp, replicas)
                    })
                    .collect();
                c.reassign(&rotated, Duration::from_secs(60));
                eprintln!("election: {}", c.elect_preferred_leaders().trim());
                let data: Vec<_> = rotated
                    .into_iter()
                    .filter(|((t, p), _)| *p == 0 && t != TXN_LOG)
                    .collect();
                let shrunk: Vec<_> = data
                    .iter()
                    .map(|(tp, r)| (tp.clone(), r[..2].to_vec()))
                    .collect();
                c.reassign(&shrunk, Duration::from_secs(60));
                c.reassign(&data, Duration::from_secs(120));
                c.wait_full_isr(Duration::from_secs(120));
            }
            Fault::Cut => {
                let node = busiest(c);
                c.cut(node);
                eprintln!("node {node} cut off for 60 s (leads the run's partitions, the ledgers', the transaction log's)");
                std::thread::sleep(Duration::from_secs(60));
                c.heal(node);
                c.wait_full_isr(Duration::from_secs(120));
            }
        }
    }
}

const TXN_LOG: &str = "__transaction_state";

/// The node leading the most partitions now.
fn busiest(c: &KafkaCluster) -> i32 {
    c.leader_counts()
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .expect("nodes")
        .0
}

/// The partitions of the run's topics (data and ledgers) and of the
/// transaction log, with their replicas: the ones a fault should hit.
fn ours(c: &KafkaCluster, prefixes: &[&str]) -> Vec<((String, i32), Vec<i32>)> {
    c.layout()
        .expect("metadata")
        .into_iter()
        .filter(|((t, _), _)| {
            t == TXN_LOG || prefixes.iter().any(|p| t.starts_with(&format!("{p}.")))
        })
        .map(|(tp, (_, replicas, _))| (tp, replicas))
        .collect()
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
