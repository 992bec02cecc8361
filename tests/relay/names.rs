//! `outboxd run` on a schema, table and publication named with spaces,
//! quotes, a comma, mixed case and non-ASCII letters: relayed to Kafka,
//! confirmed, and watched (the table watch finds it under that name).

use std::collections::HashSet;
use std::time::Duration;

use crate::harness::http::{free_port, get};
use crate::harness::kafka::shared;
use crate::harness::pg::quote_ident;
use crate::harness::relay::{confirmed_lsn, env, lsn_now, Relay};
use crate::harness::wait::wait_for;

const SCHEMA: &str = "Ventes \"EU\"";
const TABLE: &str = "Outbox Évènements, v2";
const PUBLICATION: &str = "Pub \"Ü\", l'été";

/// A TOML basic string holding `s`.
fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn readyz(port: u16) -> (u16, String) {
    get(port, "/readyz").unwrap_or((0, "no answer".into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_are_relayed_confirmed_and_watched() {
    let port = free_port();
    let extra = format!(
        "[outbox]\ntable = {{ schema = {}, name = {} }}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n",
        toml_str(SCHEMA),
        toml_str(TABLE)
    );
    let e = env(shared().bootstrap(), "oddnames", &extra);
    let config = std::fs::read_to_string(&e.config).unwrap().replace(
        "[postgres]\n",
        &format!("[postgres]\npublication = {}\n", toml_str(PUBLICATION)),
    );
    std::fs::write(&e.config, config).unwrap();
    let table = format!("{}.{}", quote_ident(SCHEMA), quote_ident(TABLE));
    e.pg.batch(
        "app",
        &format!(
            "CREATE SCHEMA {}; CREATE TABLE {table} (LIKE public.outbox INCLUDING ALL)",
            quote_ident(SCHEMA)
        ),
    )
    .await;
    let mut relay = Relay::start(&e);
    let ready = tokio::task::block_in_place(|| {
        (0..600).any(|_| readyz(port).0 == 200 || relay.wait(Duration::from_millis(100)).is_some())
            && readyz(port).0 == 200
    });
    assert!(ready, "not ready; log:\n{}", relay.log());

    let client = e.pg.client("app").await;
    let mut ids = HashSet::new();
    for i in 0..20 {
        let id = uuid::Uuid::new_v4().to_string();
        client
            .execute(
                &format!(
                    "INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, payload) \
                     VALUES ($1::text::uuid, 'order', $2, 'order.placed', '{{}}')"
                ),
                &[&id, &format!("o-{i}")],
            )
            .await
            .unwrap();
        ids.insert(id);
    }
    let written = lsn_now(&e.pg);
    let records = tokio::task::block_in_place(|| {
        shared().consume_all("oddnames.order", 20, Duration::from_secs(60))
    });
    let got: HashSet<String> = records
        .iter()
        .map(|r| String::from_utf8(r.header("id").unwrap().to_vec()).unwrap())
        .collect();
    assert_eq!(got, ids, "log:\n{}", relay.log());
    let pg = &e.pg;
    tokio::task::block_in_place(|| {
        wait_for(
            "confirmation past the writes",
            Duration::from_secs(30),
            || confirmed_lsn(pg, "oddnames") >= written,
        )
    });
    assert_eq!(readyz(port).0, 200, "{}", relay.log());

    // The watch finds the table under its name, and notices it leave.
    e.pg.batch(
        "app",
        &format!(
            "ALTER PUBLICATION {} DROP TABLE {table}",
            quote_ident(PUBLICATION)
        ),
    )
    .await;
    tokio::task::block_in_place(|| {
        wait_for("the halt", Duration::from_secs(30), || {
            readyz(port).0 == 503
        })
    });
    let (_, reason) = readyz(port);
    let fix = format!(
        "ALTER PUBLICATION {} ADD TABLE {table}",
        quote_ident(PUBLICATION)
    );
    assert!(reason.contains(&fix), "{fix:?} not in {reason}");
}
