#!/usr/bin/env bash
# Debezium's Outbox EventRouter and outboxd side by side on the worked example
# of docs/debezium-migration.md: the same rows, read by both from their own
# slots on one PostgreSQL, sent to one Kafka broker (Debezium to dbz.*,
# outboxd to obx.*), then compared record by record, every byte: topic (after
# the prefix), partition, key, value (tombstones included) and headers.
#
#   scripts/debezium_compare.sh [ROWS]     default 40 varied rows
#
# Debezium 3.6 on Kafka Connect standalone (scripts/debezium.sh fetch, cached),
# StringConverter for keys and values, as the guide's example. Prints the
# differences and exits 1 if there are any besides the one documented:
# Debezium's own __debezium.context.* headers, which are listed but not
# counted. Environment: OUTBOXD_CACHE, CARGO_TARGET_DIR as for the build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rows=${1:-40}
log() { echo "debezium_compare: $*" >&2; }

# shellcheck source=scripts/lib/servers.sh
source scripts/lib/servers.sh
# shellcheck source=scripts/lib/connect.sh
source scripts/lib/connect.sh
work=$(mktemp -d /tmp/outboxd-dbzcmp.XXXXXX)
chmod 755 "$work"
connect_pid= relay_pid=
cleanup() {
  [[ -z $connect_pid ]] || kill "$connect_pid" 2>/dev/null || true
  [[ -z $relay_pid ]] || kill "$relay_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  servers_stop
  if [[ -z ${KEEP:-} ]]; then rm -rf "$work"; else log "kept $work"; fi
}
trap cleanup EXIT

log "building outboxd and kafka_dump"
cargo build --locked --bin outboxd --example kafka_dump >&2
target=${CARGO_TARGET_DIR:-$root/target}/debug
dbz_libs=$(scripts/debezium.sh fetch)

servers_pg_start "$work" 15
servers_kafka_start "$work"
servers_psql postgres -c "CREATE DATABASE app"
servers_psql app <<'SQL'
CREATE TABLE public.outboxevent (
  id            uuid         NOT NULL PRIMARY KEY,
  aggregatetype varchar(255) NOT NULL,
  aggregateid   varchar(255) NOT NULL,
  type          varchar(255) NOT NULL,
  payload       jsonb,
  tenant        text
);
CREATE PUBLICATION cmp FOR TABLE public.outboxevent WITH (publish = 'insert');
SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput');
SQL

connect_files "$work" app 1000 WARN
cat >>"$work/outbox.properties" <<CONF
name=orders-outbox
topic.prefix=app
publication.name=cmp
table.include.list=public.outboxevent
tombstones.on.delete=false
poll.interval.ms=100
topic.creation.enable=true
topic.creation.default.partitions=3
topic.creation.default.replication.factor=1
transforms.outbox.table.field.event.key=aggregateid
transforms.outbox.table.field.event.payload=payload
transforms.outbox.route.by.field=aggregatetype
transforms.outbox.route.topic.replacement=dbz.outbox.event.\${routedByValue}
transforms.outbox.route.tombstone.on.empty.payload=true
transforms.outbox.table.fields.additional.placement=type:header:eventType,tenant:header
CONF
# The guide's outboxd.toml, but for the topic prefix and the test servers.
cat >"$work/outboxd.toml" <<CONF
[postgres]
url = "$PG_URL_BASE/app?sslmode=disable"
publication = "cmp"
create_publication = false
[outbox]
table = "public.outboxevent"
[outbox.columns]
id = "id"
key = "aggregateid"
aggregate_type = "aggregatetype"
event_type = "type"
payload = "payload"
[kafka]
brokers = "$KAFKA_BROKERS"
topic_partitions = 3
[routing]
topic = "obx.outbox.event.\${aggregate_type}"
tombstone_on_empty_payload = true
additional_headers = { eventType = "event_type", tenant = "tenant" }
CONF

log "starting Kafka Connect with Debezium"
connect_run "$work" "$dbz_libs" -Xms256m -Xmx1g >"$work/connect.log" 2>&1 &
connect_pid=$!
# Debezium streams from where it starts (no snapshot): write only once it does.
for _ in $(seq 300); do
  [[ $(servers_psql app -At -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'debezium' AND active") == 1 ]] && break
  kill -0 "$connect_pid" || { tail -n 40 "$work/connect.log" >&2; exit 1; }
  sleep 0.5
done
servers_psql app -c "INSERT INTO outboxevent VALUES (gen_random_uuid(), 'warmup', 'w', 'Warmup', '{}', NULL)"
"$target/examples/kafka_dump" "$KAFKA_BROKERS" 1 dbz.outbox.event.warmup >/dev/null ||
  { tail -n 40 "$work/connect.log" >&2; exit 1; }

log "writing $rows rows"
python3 - "$rows" >"$work/rows.sql" <<'PY'
import json, sys, uuid
n = int(sys.argv[1])
types = ["order", "customer", "payment.v2", "Order-Line_1"]
payloads = [
    {"id": 1, "customerId": 123},
    {"note": "Привет 🎉 \"quoted\" \\ back", "tab": "\t"},
    {"nested": {"a": [1, 2.5, -3e3, None, True]}, "empty": {}},
    [],
    "just a string",
    12345678901234567890,
    {},
]
def q(v):
    return "NULL" if v is None else "'" + str(v).replace("'", "''") + "'"
print("BEGIN;")
for i in range(n):
    if i % 10 == 9:
        print("COMMIT; BEGIN;")
    agg = ["1", "42", "ключ-7", "a b", "x" * 60][i % 5]
    payload = None if i % 8 == 5 else json.dumps(payloads[i % len(payloads)], ensure_ascii=False)
    tenant = None if i % 3 == 0 else ["acme", "ünïcode", ""][i % 3]
    print(f"INSERT INTO outboxevent VALUES ({q(uuid.uuid4())}, {q(types[i % len(types)])}, {q(agg)}, "
          f"{q(['OrderCreated', 'OrderShipped', 'customer.updated'][i % 3])}, {q(payload)}, {q(tenant)});")
print("COMMIT;")
PY
servers_psql app -f "$work/rows.sql" >/dev/null
total=$((rows + 1))

log "starting outboxd"
"$target/outboxd" run --config "$work/outboxd.toml" 2>"$work/relay.log" &
relay_pid=$!
# Every record of each side, until none has come for a while.
"$target/examples/kafka_dump" "$KAFKA_BROKERS" "$total" '^dbz\..*' >/dev/null ||
  { tail -n 40 "$work/connect.log" >&2; exit 1; }
"$target/examples/kafka_dump" "$KAFKA_BROKERS" "$total" '^obx\..*' >/dev/null ||
  { tail -n 40 "$work/relay.log" >&2; exit 1; }
"$target/examples/kafka_dump" "$KAFKA_BROKERS" 0 '^dbz\..*' >"$work/dbz.jsonl"
"$target/examples/kafka_dump" "$KAFKA_BROKERS" 0 '^obx\..*' >"$work/obx.jsonl"

python3 - "$work/dbz.jsonl" "$work/obx.jsonl" <<'PY'
import json, sys
def load(path, prefix):
    out, context, nulls = [], set(), 0
    for line in open(path):
        r = json.loads(line)
        headers = []
        for name, value in r["headers"]:
            if name.startswith("__debezium.context."):
                context.add(name)
            else:
                # A header with a null value (not an empty one) is compared
                # in its place like any other; counted too.
                nulls += value is None
                headers.append((name, value))
        topic = r["topic"][len(prefix):]
        out.append((topic, r["partition"], r["key"], r["value"], tuple(headers)))
    return out, context, nulls
dbz, context, dbz_nulls = load(sys.argv[1], "dbz.")
obx, obx_context, obx_nulls = load(sys.argv[2], "obx.")
# Order within a partition is what Kafka keeps; compare per partition.
def by_partition(records):
    parts = {}
    for r in records:
        parts.setdefault((r[0], r[1]), []).append(r)
    return parts
a, b = by_partition(dbz), by_partition(obx)
diffs = 0
for p in sorted(set(a) | set(b)):
    ra, rb = a.get(p, []), b.get(p, [])
    if ra != rb:
        diffs += 1
        print(f"DIFFERENT {p}: {len(ra)} vs {len(rb)} records")
        for x, y in zip(ra, rb):
            if x != y:
                print("  debezium:", x)
                print("  outboxd: ", y)
tombstones = sum(1 for r in dbz if r[3] is None)
print(f"records: debezium {len(dbz)}, outboxd {len(obx)} (tombstones {tombstones}) in "
      f"{len(a)} topic-partitions; partitions whose records differ in topic, key, value "
      f"or headers (null values included): {diffs}")
print(f"null-valued headers (for NULL columns): debezium {dbz_nulls}, outboxd {obx_nulls}")
print(f"headers only Debezium sends: {sorted(context)}; only outboxd: {sorted(obx_context)}")
sys.exit(1 if diffs or len(dbz) != len(obx) or dbz_nulls != obx_nulls else 0)
PY
