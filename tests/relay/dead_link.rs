//! The link to PostgreSQL turns into a black hole under a running relay:
//! every packet is dropped, no reset or FIN arrives, the server keeps its
//! side open (the outage is shorter than its wal_sender_timeout). Writes go
//! on meanwhile. The relay must notice on its own within
//! `postgres.stream_timeout`, say so in its log and on `/readyz`, reconnect
//! once the link heals, and lose nothing.

use std::time::{Duration, Instant};

use crate::harness::events::{aggregates, payload_texts, verify, write};
use crate::harness::http::{free_port, get};
use crate::harness::kafka::shared;
use crate::harness::proxy::Proxy;
use crate::harness::relay::{confirmed_lsn, env, lsn_now, Relay};
use crate::harness::wait::wait_for;

/// postgres.stream_timeout, shorter than its default (30 s) so the outage
/// is short too; the relay probes a silent link at a third of it, so a
/// healthy one is still never taken for dead.
const STREAM_TIMEOUT: Duration = Duration::from_secs(8);

/// postgres.connect_timeout, shorter than its default (10 s): a reconnect
/// attempt into the black hole must time out within the outage.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_link_is_noticed_reported_and_recovered_without_loss() {
    let broker = shared();
    let metrics_port = free_port();
    let e = env(
        broker.bootstrap(),
        "deadlink",
        &format!(
            "[relay]\nreconnect_backoff_max = \"2s\"\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\nslot_sample_interval = \"1s\"\n"
        ),
    );
    let pg = &e.pg;
    // The relay (stream, SQL connection, slot sampler) goes through the
    // proxy; the writer below connects directly.
    let proxy = Proxy::start(([127, 0, 0, 1], pg.port()).into());
    let text = std::fs::read_to_string(&e.config).unwrap().replace(
        &format!("127.0.0.1:{}/", pg.port()),
        &format!("127.0.0.1:{}/", proxy.port()),
    );
    assert!(text.contains(&format!(":{}/", proxy.port())), "{text}");
    std::fs::write(&e.config, text).unwrap();
    let (stream_timeout, connect_timeout) = (
        format!("{}s", STREAM_TIMEOUT.as_secs()),
        format!("{}s", CONNECT_TIMEOUT.as_secs()),
    );
    let relay = Relay::start_with_env(
        &e,
        &[
            ("OUTBOXD_POSTGRES__STREAM_TIMEOUT", &stream_timeout),
            ("OUTBOXD_POSTGRES__CONNECT_TIMEOUT", &connect_timeout),
        ],
    );
    let ready = |what: &str| {
        wait_for(what, Duration::from_secs(90), || {
            get(metrics_port, "/readyz").is_some_and(|(status, _)| status == 200)
        })
    };
    let aggs = aggregates(10);
    let mut sent = Vec::new();
    let mut client = pg.client("app").await;
    sent.extend(write(&mut client, "deadlink", &aggs, 300, &[1, 10], 0).await);
    tokio::task::block_in_place(|| {
        ready("the relay to become ready");
        let end = lsn_now(pg);
        wait_for(
            "the first events to be confirmed",
            Duration::from_secs(60),
            || confirmed_lsn(pg, "deadlink") >= end,
        );
    });

    proxy.black_hole();
    let cut = Instant::now();
    // Writes go on during the outage.
    let writer = {
        let aggs = aggs.clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for _ in 0..10 {
                out.extend(write(&mut client, "deadlink", &aggs, 40, &[1, 5], 0).await);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            (client, out)
        })
    };
    // /readyz must turn 503 and say why, within the stream timeout (plus
    // slack for a loaded machine).
    let limit = STREAM_TIMEOUT + Duration::from_secs(15);
    let (noticed_after, reason, other_answers) = tokio::task::block_in_place(|| {
        let mut others = Vec::new();
        loop {
            let answer = get(metrics_port, "/readyz");
            if let Some((503, body)) = &answer {
                if body.contains("postgres.stream_timeout") {
                    return (Some(cut.elapsed()), body.clone(), others);
                }
            }
            if others.last() != Some(&answer) {
                others.push(answer);
            }
            if cut.elapsed() > limit {
                return (None, String::new(), others);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    let Some(noticed_after) = noticed_after else {
        panic!(
            "the relay did not notice the dead link within {limit:?}; /readyz answered {other_answers:?}; log:\n{}",
            relay.log()
        );
    };
    eprintln!(
        "dead link noticed after {noticed_after:.1?}: /readyz 503 {}",
        reason.trim()
    );
    let log = relay.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("postgres.stream_timeout")),
        "no log line names the dead link:\n{log}"
    );

    // Stay dead a while longer: reconnect attempts meet the black hole too
    // and must time out rather than hang (postgres.connect_timeout).
    let timed_out = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + CONNECT_TIMEOUT * 3 + Duration::from_secs(10);
        while Instant::now() < deadline {
            if relay.log().contains("(postgres.connect_timeout)") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        false
    });
    assert!(
        timed_out,
        "no reconnect attempt timed out in the black hole:\n{}",
        relay.log()
    );
    let (status, body) = get(metrics_port, "/readyz").expect("/readyz answers");
    assert_eq!(status, 503, "still dead, yet ready: {body}");
    let outage = cut.elapsed();
    proxy.heal();

    let (mut client, during) = writer.await.unwrap();
    sent.extend(during);
    sent.extend(write(&mut client, "deadlink", &aggs, 200, &[1, 10], 0).await);
    let healed = Instant::now();
    tokio::task::block_in_place(|| {
        ready("the relay to be ready again after the link healed");
        let end = lsn_now(pg);
        wait_for(
            "the slot to catch up after the outage",
            Duration::from_secs(90),
            || confirmed_lsn(pg, "deadlink") >= end,
        );
    });
    let recovered_after = healed.elapsed();
    let log = relay.log();
    assert!(
        log.contains("replication started") && log.matches("replication started").count() >= 2,
        "the relay did not reconnect:\n{log}"
    );
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(pg);
    let v = tokio::task::block_in_place(|| {
        verify(broker, &sent, &texts, Duration::from_secs(120), true, &logs)
    });
    eprintln!(
        "dead link: outage {outage:.1?}, noticed after {noticed_after:.1?}, recovered {recovered_after:.1?} after healing; \
         {} of {} events delivered, {} duplicates",
        v.delivered,
        sent.len(),
        v.duplicates
    );
}
