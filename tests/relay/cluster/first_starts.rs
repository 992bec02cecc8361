//! Issue 38, "a fresh topic on a cluster": first starts in a row, each with
//! a fresh slot and a ledger topic outboxd creates; none may exit (once in
//! 12 one did: the broker it asked had not applied the new topic yet).

use std::time::{Duration, Instant};

use crate::harness::relay::{edit_config, Env, Relay};
use crate::harness::wait::wait_for;

/// Starts outboxd `n` times on `e` (made with the slot `clfirst0`), each
/// on a fresh slot and ledger topic, until replication started; the starts
/// that exited instead, with their log.
pub(super) fn first_starts(e: &Env, n: usize) -> Vec<(usize, String)> {
    let ledger = |i: usize| format!("clfirst.ledger.{i}.{}", uuid::Uuid::new_v4().simple());
    let mut current = ledger(0);
    edit_config(
        e,
        "topic_partitions = 3\n",
        &format!(
            "topic_partitions = 3\ntopic_replication_factor = -1\nledger_topic = \"{current}\"\n\
             ledger_replication_factor = 3\n"
        ),
    );
    let mut exits = Vec::new();
    let started = Instant::now();
    for i in 0..n {
        if i > 0 {
            let slot = format!("clfirst{i}");
            // A fresh slot each time; the server has room for 10.
            e.pg.psql(
                "app",
                &format!(
                    "SELECT pg_drop_replication_slot('clfirst{}'); \
                     SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')",
                    i - 1
                ),
            );
            edit_config(
                e,
                &format!("slot = \"clfirst{}\"", i - 1),
                &format!("slot = \"{slot}\""),
            );
            let next = ledger(i);
            edit_config(
                e,
                &format!("ledger_topic = \"{current}\""),
                &format!("ledger_topic = \"{next}\""),
            );
            current = next;
        }
        let mut relay = Relay::start(e);
        wait_for(
            "replication started or an exit",
            Duration::from_secs(60),
            || relay.exited() || relay.log().contains("replication started"),
        );
        // The ledger topic is settled before replication starts; an exit
        // right after the start counts too.
        std::thread::sleep(Duration::from_millis(300));
        if relay.exited() {
            exits.push((i, relay.log()));
        } else {
            relay.signal("-TERM");
            relay.wait(Duration::from_secs(30));
        }
    }
    eprintln!(
        "CLUSTER first starts: {} of {n} exited ({:.0} s)",
        exits.len(),
        started.elapsed().as_secs_f64()
    );
    exits
}
