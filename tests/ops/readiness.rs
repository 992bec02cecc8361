//! Issue 9, point 9: `/readyz` on a healthy start. Ready once the replication
//! stream is open and the producer has reached a broker, without waiting for
//! librdkafka's first statistics (every 5 s) or for a first event.

use std::time::{Duration, Instant};

use crate::harness::http::{free_port, get};
use crate::harness::kafka::shared;
use crate::harness::relay::{env, Relay};

#[test]
fn readyz_answers_200_within_two_seconds_of_the_stream_opening() {
    let broker = shared();
    let port = free_port();
    let extra = format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    let e = env(broker.bootstrap(), "opsready", &extra);
    let relay = Relay::start(&e);
    // Poll: the PostgreSQL reason goes away when the stream opens; from then
    // on only Kafka can hold readiness back. No events are written, so no
    // acknowledgement can make it ready either.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stream_open: Option<Instant> = None;
    let mut answers = Vec::new();
    let ready = loop {
        assert!(
            Instant::now() < deadline,
            "not ready after 60 s; answers: {answers:?}\nrelay log:\n{}",
            relay.log()
        );
        let answer = get(port, "/readyz");
        let now = Instant::now();
        if let Some((status, body)) = &answer {
            if stream_open.is_none() && !body.contains("PostgreSQL") {
                stream_open = Some(now);
            }
            if answers.last() != Some(&(*status, body.clone())) {
                answers.push((*status, body.clone()));
            }
            if *status == 200 {
                break now;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = ready - stream_open.expect("the stream opened");
    eprintln!("readiness: 200 {took:?} after the stream opened; answers: {answers:?}");
    assert!(
        took < Duration::from_secs(2),
        "/readyz took {took:?} after the stream opened; answers: {answers:?}"
    );
}
