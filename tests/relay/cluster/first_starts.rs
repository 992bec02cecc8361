//! Issue 38, "a fresh topic on a cluster": first starts in a row, each with
//! a fresh slot and a ledger topic outboxd creates; none may exit (once in
//! 12 one did: the broker it asked had not applied the new topic yet).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::relay::{Env, Relay};
use crate::harness::wait::wait_for;

/// First starts going on at once. The relays' start and the calm before
/// the first fault take a third of what 20 starts one after the other take,
/// so the test waited on them; two at once also create their ledger topics
/// side by side, which gives the race each start checks more chances, not
/// fewer.
const LANES: usize = 2;

/// Starts outboxd `n` times on `e` (made with the slot `clfirst0`), each
/// on a fresh slot and ledger topic, until replication started; the starts
/// that exited instead, with their log.
pub(super) fn first_starts(e: &Env, n: usize) -> Vec<(usize, String)> {
    let template = std::fs::read_to_string(&e.config).unwrap();
    assert!(template.contains("slot = \"clfirst0\""), "{template}");
    let started = Instant::now();
    let mut exits: Vec<(usize, String)> = std::thread::scope(|s| {
        let lanes: Vec<_> = (0..LANES)
            .map(|lane| {
                let template = &template;
                s.spawn(move || lane_of_starts(e, template, lane, n))
            })
            .collect();
        lanes
            .into_iter()
            .flat_map(|l| l.join().expect("a lane of first starts"))
            .collect()
    });
    exits.sort_by_key(|&(i, _)| i);
    eprintln!(
        "CLUSTER first starts: {} of {n} exited ({:.0} s, {LANES} at a time)",
        exits.len(),
        started.elapsed().as_secs_f64()
    );
    exits
}

/// The starts `lane`, `lane + LANES`, … below `n`, one after the other, each
/// with a config of its own made from `template`: its slot `clfirst{i}`
/// (the one before it in the lane dropped: the server has room for 10) and
/// a fresh ledger topic.
fn lane_of_starts(e: &Env, template: &str, lane: usize, n: usize) -> Vec<(usize, String)> {
    let config = e.dir.path().join(format!("first-starts-{lane}.toml"));
    let mut exits = Vec::new();
    let mut previous: Option<usize> = None;
    for i in (lane..n).step_by(LANES) {
        let slot = format!("clfirst{i}");
        // `clfirst0` comes with `e`; the others are made here.
        let drop_previous = previous.map_or(String::new(), |p| {
            format!("SELECT pg_drop_replication_slot('clfirst{p}'); ")
        });
        if i > 0 {
            e.pg.psql(
                "app",
                &format!(
                    "{drop_previous}SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
                ),
            );
        }
        previous = Some(i);
        let ledger = format!("clfirst.ledger.{i}.{}", uuid::Uuid::new_v4().simple());
        let text = template
            .replacen("slot = \"clfirst0\"", &format!("slot = \"{slot}\""), 1)
            .replacen(
                "topic_partitions = 3\n",
                &format!(
                    "topic_partitions = 3\ntopic_replication_factor = -1\n\
                     ledger_topic = \"{ledger}\"\nledger_replication_factor = 3\n"
                ),
                1,
            );
        std::fs::write(&config, text).unwrap();
        if let Some(log) = first_start(&config, e.dir.path()) {
            exits.push((i, log));
        }
    }
    exits
}

/// One start on `config`; its log if it exited instead of replicating.
fn first_start(config: &Path, logs: &Path) -> Option<String> {
    let mut relay = Relay::start_config(config, logs, &[], &[]);
    wait_for(
        "replication started or an exit",
        Duration::from_secs(60),
        || relay.exited() || relay.log().contains("replication started"),
    );
    // The ledger topic is settled before replication starts; an exit
    // right after the start counts too.
    std::thread::sleep(Duration::from_millis(300));
    if relay.exited() {
        return Some(relay.log());
    }
    relay.signal("-TERM");
    relay.wait(Duration::from_secs(30));
    None
}
