#!/usr/bin/env bash
# How long `outboxd audit` takes over a large range, and how much memory:
# writes ROWS outbox rows (default 1,000,000), relays them with `outboxd run`
# to Kafka, then runs `outboxd audit` over the range under /usr/bin/time -v
# and prints its report, wall time and peak RSS. Private PostgreSQL and
# Kafka on loopback (scripts/lib/servers.sh), removed at the end.
#
#   scripts/audit-scale.sh [ROWS]
#
# Environment: NO_INDEX=1 (no index on created_at), OUTBOXD_BIN (default: target/release/outboxd, built first),
# OUTBOXD_PG_VERSION (default 15), PARTITIONS (default 6), KEYS (default 10000).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rows=${1:-1000000}
partitions=${PARTITIONS:-6}
keys=${KEYS:-10000}
version=${OUTBOXD_PG_VERSION:-15}
# shellcheck source=lib/servers.sh
source "$repo/scripts/lib/servers.sh"

if [[ -z ${OUTBOXD_BIN:-} ]]; then
  (cd "$repo" && cargo build --release --locked --bin outboxd >&2)
  OUTBOXD_BIN=${CARGO_TARGET_DIR:-$repo/target}/release/outboxd
fi

work=$(mktemp -d /tmp/outboxd-audit-scale.XXXXXX)
chmod 755 "$work"
relay_pid=
cleanup() {
  [[ -n $relay_pid ]] && kill "$relay_pid" 2>/dev/null && wait "$relay_pid" 2>/dev/null
  servers_stop
  rm -rf "$work"
}
trap cleanup EXIT

servers_pg_start "$work" "$version" "max_wal_size = 4GB" "fsync = off" "synchronous_commit = off"
servers_kafka_start "$work"
servers_psql postgres -c "CREATE DATABASE app"
for f in "$repo"/migrations/00*.sql; do servers_psql app -f "$f" >/dev/null; done
# As docs/operations.md recommends for tables whose rows are kept: the
# audit's (and backfill's) pages are range scans on it. NO_INDEX=1 leaves it
# out (every page is then a sequential scan).
if [[ -z ${NO_INDEX:-} ]]; then
  servers_psql app -c "CREATE INDEX outbox_created_at ON outbox (created_at)" >/dev/null
fi

cat >"$work/outboxd.toml" <<EOF
[postgres]
url = "$PG_URL_BASE/app"
slot = "scale"
[kafka]
brokers = "$KAFKA_BROKERS"
topic_partitions = $partitions
[routing]
topic = "scale.\${aggregate_type}"
EOF

# The slot first, so the relay reads every row.
servers_psql app -c "SELECT pg_create_logical_replication_slot('scale', 'pgoutput')" >/dev/null
since=$(servers_psql app -Atc "SELECT now()")
echo "writing $rows rows ($keys keys, 1,000-row transactions)..." >&2
servers_psql app -c "
  DO \$\$
  BEGIN
    FOR b IN 0 .. ($rows - 1) / 1000 LOOP
      INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
      SELECT CASE WHEN i % 2 = 0 THEN 'order' ELSE 'payment' END, 'agg-' || i % $keys, 'happened',
             jsonb_build_object('i', i, 'note', repeat('x', 200))
      FROM generate_series(b * 1000, least(b * 1000 + 999, $rows - 1)) AS i;
      COMMIT;
    END LOOP;
  END
  \$\$" >/dev/null
until=$(servers_psql app -Atc "SELECT now()")

echo "relaying them..." >&2
start=$(date +%s)
OUTBOXD_LOG=warn "$OUTBOXD_BIN" run --config "$work/outboxd.toml" 2>"$work/relay.log" &
relay_pid=$!
end_lsn=$(servers_psql app -Atc "SELECT pg_current_wal_lsn()")
while [[ $(servers_psql app -Atc "SELECT confirmed_flush_lsn >= '$end_lsn' FROM pg_replication_slots WHERE slot_name = 'scale'") != t ]]; do
  kill -0 "$relay_pid" || { cat "$work/relay.log" >&2; exit 1; }
  sleep 1
done
echo "relayed in $(($(date +%s) - start)) s" >&2
kill "$relay_pid"
wait "$relay_pid" || true
relay_pid=

# Whether autovacuum has analyzed the table yet changes PostgreSQL's plans
# (a backfill's keyset pages sort the rest of the window without
# statistics; the audit's single query does not care): say which it was.
analyzed=$(servers_psql app -Atc "SELECT coalesce(greatest(last_analyze, last_autoanalyze)::text, 'never') FROM pg_stat_user_tables WHERE relname = 'outbox'")
echo "auditing (outbox table last analyzed: $analyzed)..." >&2
/usr/bin/time -v "$OUTBOXD_BIN" audit --config "$work/outboxd.toml" --since "$since" --until "$until" \
  >"$work/report.txt" 2>"$work/time.txt" || true
cat "$work/report.txt"
grep -E "Elapsed \(wall clock\)|Maximum resident set size|User time|System time|Exit status" "$work/time.txt"
du -sh "$work/pg" "$work/kafka" 2>/dev/null | sed 's/^/data: /' >&2
