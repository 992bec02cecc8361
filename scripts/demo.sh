#!/usr/bin/env bash
# The main job, end to end, on this machine: builds outboxd, starts a private
# PostgreSQL (wal_level=logical) and a single-node Kafka broker, applies the
# migrations, runs `outboxd run`, writes sample payments in transactions
# (each with its outbox event) and shows the events arriving in Kafka.
# Everything lives under .demo/ and is stopped when the script ends.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
demo=$root/.demo
scripts/setup.sh
echo "== building outboxd (release, as in the README: one build serves both)"
cargo build --release --bin outboxd --example kafka_read
bin_dir=${CARGO_TARGET_DIR:-$root/target}/release

rm -rf "$demo" && mkdir -p "$demo"
chmod 755 "$demo"
as_pg=()
if [[ $(id -u) == 0 ]]; then as_pg=(runuser -u outboxd-test --); chown outboxd-test "$demo"; fi
pgbin=$(scripts/postgres.sh bin 15)
pgport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

cleanup() {
  [[ -n ${relay_pid:-} ]] && kill "$relay_pid" 2>/dev/null && wait "$relay_pid" 2>/dev/null || true
  scripts/kafka.sh stop "$demo/kafka" >/dev/null 2>&1 || true
  "${as_pg[@]}" "$pgbin/pg_ctl" -D "$demo/pg" -m fast stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== starting PostgreSQL on 127.0.0.1:$pgport"
"${as_pg[@]}" "$pgbin/initdb" -D "$demo/pg" -U postgres -A trust -E UTF8 >/dev/null
cat >>"$demo/pg/postgresql.conf" <<CONF
wal_level = logical
listen_addresses = '127.0.0.1'
port = $pgport
unix_socket_directories = '$demo'
CONF
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$demo/pg" -l "$demo/pg.log" -w start >/dev/null
pgurl="postgresql://postgres@127.0.0.1:$pgport/postgres"
for f in migrations/0*.sql; do psql -q -v ON_ERROR_STOP=1 "$pgurl" -f "$f"; done
psql -q "$pgurl" -c "CREATE TABLE payments (id bigint PRIMARY KEY, amount numeric NOT NULL, status text NOT NULL)"

echo "== starting Kafka"
mkdir -p "$demo/kafka"
brokers=$(scripts/kafka.sh start "$demo/kafka")
echo "   broker at $brokers"

cat >"$demo/outboxd.toml" <<CONF
[postgres]
url = "$pgurl?sslmode=disable"
[kafka]
brokers = "$brokers"
[routing]
value = "envelope"
[[routing.rules]]
event_type_prefix = "payment."
topic = "payments"
CONF

echo "== running outboxd run"
"$bin_dir/outboxd" run --config "$demo/outboxd.toml" 2>"$demo/outboxd.log" &
relay_pid=$!
# Events committed before the slot exists are not in it (a genuinely first
# start): wait until outboxd streams its slot.
streaming=
for _ in $(seq 1 120); do
  if ! kill -0 "$relay_pid" 2>/dev/null; then
    echo "outboxd run exited early:" >&2
    cat "$demo/outboxd.log" >&2
    exit 1
  fi
  if [[ $(psql -Atq "$pgurl" -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'outboxd' AND active") == 1 ]]; then
    streaming=1
    break
  fi
  sleep 0.5
done
if [[ -z $streaming ]]; then
  echo "outboxd run did not start streaming within 60 s:" >&2
  cat "$demo/outboxd.log" >&2
  exit 1
fi

echo "== writing 10 payments, each with its outbox event in the same transaction"
for i in $(seq 1 10); do
  psql -q "$pgurl" >/dev/null <<SQL
BEGIN;
INSERT INTO payments VALUES ($i, $((i * 100)).50, 'paid');
SELECT outbox_emit('payment', '$i', 'payment.completed', '{"paymentId": $i, "amount": "$((i * 100)).50", "currency": "RUB"}');
COMMIT;
SQL
done
# A rolled-back payment: its event must never appear.
psql -q "$pgurl" -c "BEGIN; INSERT INTO payments VALUES (99, 1, 'paid'); SELECT outbox_emit('payment', '99', 'payment.completed', '{}'); ROLLBACK;" >/dev/null

echo "== reading topic 'payments' back from Kafka"
"$bin_dir/examples/kafka_read" "$brokers" 10 payments
echo "== confirmed position of the slot (advanced only after Kafka acked):"
psql -Atq "$pgurl" -c "SELECT slot_name, confirmed_flush_lsn FROM pg_replication_slots"
echo "== done; outboxd log: $demo/outboxd.log"
