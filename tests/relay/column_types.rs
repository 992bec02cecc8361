//! Issue 9, point 5: column types. A `bytea` column gives Kafka its bytes
//! (pgoutput sends PostgreSQL's `\x…` hex text), as value, key or header.

use std::time::Duration;

use crate::harness::kafka::shared;
use crate::harness::relay::{env, Relay};

/// (id, key, payload, trace header) of one row.
type BinRow = (&'static str, &'static [u8], &'static [u8], &'static [u8]);

#[test]
fn bytea_columns_arrive_as_their_bytes() {
    let broker = shared();
    let extra = "[outbox]\ntable = \"public.bin_outbox\"\n\
                 [routing]\ntopic = \"bytea.${aggregate_type}\"\n\
                 additional_headers = { trace = \"trace\" }\n";
    let e = env(broker.bootstrap(), "bytea", extra);
    e.pg.psql(
        "app",
        "CREATE TABLE bin_outbox (id uuid PRIMARY KEY, aggregate_type text NOT NULL, \
         aggregate_id bytea NOT NULL, event_type text NOT NULL, payload bytea, trace bytea); \
         ALTER PUBLICATION outboxd ADD TABLE bin_outbox",
    );
    let relay = Relay::start(&e);
    // Not UTF-8, NUL bytes, a backslash, and an empty value.
    let rows: [BinRow; 3] = [
        (
            "00000000-0000-4000-8000-000000000001",
            b"\xde\xad\xbe\xef",
            b"\x00\xff{\"a\\\": 1}\xe2\x82\xac\x80",
            b"\x01\x02",
        ),
        (
            "00000000-0000-4000-8000-000000000002",
            b"key-2",
            b"{\"plain\": \"json in bytea\"}",
            b"t",
        ),
        (
            "00000000-0000-4000-8000-000000000003",
            b"\\",
            b"\\\x00",
            b"",
        ),
    ];
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    for (id, key, payload, trace) in &rows {
        e.pg.psql(
            "app",
            &format!(
                "INSERT INTO bin_outbox VALUES ('{id}', 'bin', '\\x{}', 'bin.made', '\\x{}', '\\x{}')",
                hex(key),
                hex(payload),
                hex(trace)
            ),
        );
    }
    let got = broker.consume_all("bytea.bin", rows.len(), Duration::from_secs(60));
    assert_eq!(got.len(), rows.len(), "{}", relay.log());
    for (id, key, payload, trace) in &rows {
        // Keys spread the rows over partitions: find each by its id.
        let r = got
            .iter()
            .find(|r| r.header("id") == Some(id.as_bytes()))
            .unwrap_or_else(|| panic!("no record with id {id}"));
        assert_eq!(r.key.as_deref(), Some(*key), "key of {id}");
        assert_eq!(r.value.as_deref(), Some(*payload), "value of {id}");
        assert_eq!(r.header("trace"), Some(*trace), "trace header of {id}");
    }
}
