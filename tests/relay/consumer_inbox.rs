//! `examples/consumer_inbox.rs`, the consumer's half of the pattern, under
//! the three ways an at-least-once consumer sees an event again: duplicates
//! in the topic, a consumer killed between its database commit and its
//! offset commit, and a rebalance. The side effect (a notification row and
//! a running total per user, neither protected by a unique constraint)
//! must happen exactly once per event.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use crate::harness::cargo::cargo;
use crate::harness::kafka::shared;
use crate::harness::relay::{env, Relay};
use crate::harness::wait::wait_for;

/// The example's binary, built on demand with this test's profile.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/main-<hash>
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let release = profile_dir.ends_with("release");
    let mut build = cargo();
    build
        .args(["build", "--quiet", "--example", name])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        build.arg("--release");
    }
    let status = build.status().expect("cargo build --example");
    assert!(status.success(), "cargo build --example {name} failed");
    profile_dir.join("examples").join(name)
}

struct Consumer {
    child: Child,
    out: PathBuf,
}

impl Consumer {
    fn start(
        bin: &PathBuf,
        brokers: &str,
        db: &str,
        dir: &std::path::Path,
        args: &[&str],
    ) -> Consumer {
        let out = dir.join(format!("consumer-{}.out", uuid::Uuid::new_v4()));
        let child = Command::new(bin)
            .args([
                "--brokers",
                brokers,
                "--group",
                "notifications",
                "--topic",
                "inbox.payment",
            ])
            .args(["--database-url", db])
            // A killed member leaves the group after this, not librdkafka's 45 s.
            .args(["--property", "session.timeout.ms=6000"])
            .args(args)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start consumer_inbox");
        Consumer { child, out }
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits for exit; the exit status and stderr.
    fn wait(mut self, timeout: Duration) -> (std::process::ExitStatus, String, Vec<String>) {
        let status = crate::harness::outboxd::wait_with_timeout(&mut self.child, timeout)
            .unwrap_or_else(|| panic!("consumer still running after {timeout:?}"));
        let mut err = String::new();
        use std::io::Read;
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status, err, self.lines())
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn count(lines: &[String], prefix: &str) -> usize {
    lines.iter().filter(|l| l.starts_with(prefix)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_consumer_applies_each_event_once_through_duplicates_a_crash_and_a_rebalance() {
    const EVENTS: i64 = 6000;
    let broker = shared();
    let e = env(broker.bootstrap(), "inbox", "");
    e.pg.create_database("consumer");
    let db = e.pg.url("postgres", Some("postgres"), "consumer");
    let bin = tokio::task::block_in_place(|| example("consumer_inbox"));
    let relay = Relay::start(&e);
    // The seed's payment example: payment.completed for 20 users, in two
    // halves (the second once two consumers share the group).
    let payments = |from: i64, to: i64| {
        e.pg.psql(
            "app",
            &format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 SELECT 'payment', 'pay-' || i, 'payment.completed', \
                        jsonb_build_object('paymentId', 'pay-' || i, 'userId', 'user-' || i % 20, \
                                           'amount', 100 + i, 'currency', 'KGS') \
                 FROM generate_series({from}, {to}) AS i"
            ),
        )
    };
    let half = EVENTS / 2;
    payments(1, half);
    let topic = "inbox.payment";
    tokio::task::block_in_place(|| {
        wait_for("the events in Kafka", Duration::from_secs(60), || {
            broker.record_count(topic) >= half as usize
        })
    });

    // Duplicates at-least-once: 50 records written again as they are.
    let copies = broker.consume_all(topic, 50, Duration::from_secs(30));
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .unwrap();
    for r in &copies {
        let mut headers = rdkafka::message::OwnedHeaders::new();
        for (k, v) in &r.headers {
            headers = headers.insert(rdkafka::message::Header {
                key: k,
                value: Some(v),
            });
        }
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(r.partition)
                    .key(r.key.as_deref().unwrap())
                    .payload(r.value.as_deref().unwrap())
                    .headers(headers),
            )
            .unwrap_or_else(|(e, _)| panic!("produce: {e}"));
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    assert_eq!(broker.record_count(topic), half as usize + copies.len());
    let total = EVENTS as usize + copies.len();

    let dir = e.dir.path();
    // A consumer killed right after its 60th database commit, before that
    // offset is committed.
    let crashed = Consumer::start(
        &bin,
        broker.bootstrap(),
        &db,
        dir,
        &["--crash-after-commits", "60"],
    );
    let (status, err, first) =
        tokio::task::block_in_place(|| crashed.wait(Duration::from_secs(120)));
    assert!(!status.success(), "the consumer did not crash: {err}");
    assert!(err.contains("crashing after database commit 60"), "{err}");
    assert_eq!(count(&first, "applied "), 60, "{err}");
    let inbox = || {
        e.pg.psql("consumer", "SELECT count(*) FROM inbox")
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    assert_eq!(inbox(), 60, "the 60th event's transaction committed");

    // Two consumers of the group, the second joining while the first is
    // busy: a rebalance moves partitions between them mid-stream.
    let a = Consumer::start(&bin, broker.bootstrap(), &db, dir, &["--idle-exit-s", "20"]);
    tokio::task::block_in_place(|| {
        wait_for(
            "the first consumer to get going",
            Duration::from_secs(60),
            || inbox() > 60,
        )
    });
    let b = Consumer::start(&bin, broker.bootstrap(), &db, dir, &["--idle-exit-s", "20"]);
    // Once both are members, the second half: each consumer owns some of
    // the partitions it lands on.
    let group: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", "inbox-test-observer")
        .create()
        .unwrap();
    tokio::task::block_in_place(|| {
        wait_for(
            "both consumers in the group",
            Duration::from_secs(90),
            || {
                group
                    .fetch_group_list(Some("notifications"), Duration::from_secs(5))
                    .is_ok_and(|l| {
                        l.groups()
                            .iter()
                            .any(|g| g.state() == "Stable" && g.members().len() == 2)
                    })
            },
        )
    });
    payments(half + 1, EVENTS);
    let (sa, erra, la) = tokio::task::block_in_place(|| a.wait(Duration::from_secs(180)));
    let (sb, errb, lb) = tokio::task::block_in_place(|| b.wait(Duration::from_secs(180)));
    drop(relay);
    assert!(sa.success(), "{erra}");
    assert!(sb.success(), "{errb}");

    // Every event applied exactly once.
    let applied = count(&first, "applied ") + count(&la, "applied ") + count(&lb, "applied ");
    let dropped = count(&first, "duplicate ") + count(&la, "duplicate ") + count(&lb, "duplicate ");
    assert_eq!(inbox(), EVENTS as usize);
    assert_eq!(applied, EVENTS as usize, "applied lines");
    assert!(
        dropped > copies.len(),
        "the injected copies and the crashed consumer's last event come back as duplicates: {dropped}"
    );
    let once = e.pg.psql(
        "consumer",
        "SELECT count(*), count(DISTINCT event_id) FROM notifications",
    );
    assert_eq!(
        once.trim(),
        format!("{EVENTS}|{EVENTS}"),
        "one notification per event"
    );
    let want: HashMap<String, (i64, i64)> = (1..=EVENTS).fold(HashMap::new(), |mut m, i| {
        let t = m.entry(format!("user-{}", i % 20)).or_default();
        t.0 += 100 + i;
        t.1 += 1;
        m
    });
    let got: HashMap<String, (i64, i64)> =
        e.pg.psql(
            "consumer",
            "SELECT user_id || '|' || paid_cents || '|' || payments FROM payment_totals",
        )
        .lines()
        .filter_map(|l| {
            let mut f = l.trim().split('|');
            Some((
                f.next()?.to_owned(),
                (f.next()?.parse().ok()?, f.next()?.parse().ok()?),
            ))
        })
        .collect();
    assert_eq!(got, want, "per-user totals: each payment counted once");
    let b_got_some = count(&lb, "applied ") + count(&lb, "duplicate ") > 0;
    eprintln!(
        "inbox consumer: {total} records ({} injected copies), {applied} applied, {dropped} dropped \
         as duplicates (crashed: {}, a: {}, b: {}; b read records: {b_got_some})",
        copies.len(),
        first.len(),
        la.len(),
        lb.len()
    );
    assert!(
        b_got_some,
        "the second consumer got no partition: no rebalance happened"
    );
}
