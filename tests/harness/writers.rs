//! Writers that go on until told to stop: a test that needs the database
//! "still being written" when it strikes holds that by construction, where
//! a fixed number of events could be all written by then on a fast host.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::harness::events::{aggregates, write, Sent};
use crate::harness::relay::Env;

pub struct Writers {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<Vec<Sent>>>,
}

impl Writers {
    /// One connection per shape, each committing transactions of the
    /// shape's sizes in turn on `aggs` aggregates, routed to
    /// `{prefix}.{payment|order}`, until [`stop`](Self::stop).
    pub fn start(e: &Env, prefix: &str, shapes: &[&[usize]], aggs: usize) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let aggs = aggregates(aggs);
        let handles = shapes
            .iter()
            .map(|sizes| {
                let (stop, aggs, sizes) = (stop.clone(), aggs.clone(), sizes.to_vec());
                let url = e.pg.url("postgres", Some("postgres"), "app");
                let prefix = prefix.to_string();
                tokio::spawn(async move {
                    let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .unwrap();
                    tokio::spawn(conn);
                    // One round of the shape at a time, so every round
                    // has each size once.
                    let round: usize = sizes.iter().sum();
                    let mut sent = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        sent.extend(write(&mut client, &prefix, &aggs, round, &sizes, 0).await);
                    }
                    sent
                })
            })
            .collect();
        Writers { stop, handles }
    }

    /// How many still write: all of them until [`stop`](Self::stop),
    /// unless one failed.
    pub fn writing(&self) -> usize {
        self.handles.iter().filter(|h| !h.is_finished()).count()
    }

    /// Stops them after the round each is in; every event they committed.
    pub async fn stop(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        let mut sent = Vec::new();
        for h in self.handles {
            sent.extend(h.await.expect("a writer failed"));
        }
        sent
    }
}
