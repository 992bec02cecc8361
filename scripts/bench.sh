#!/usr/bin/env bash
# outboxd against the polling relay it replaces, same workload, side by side.
#
#   scripts/bench.sh [EVENTS] [TXN_SIZE]      defaults 50000 and 10
#
# Builds release binaries, starts a private PostgreSQL 15 and a single Kafka
# broker on loopback (stopped at the end), then for each relay - (A) `outboxd
# run`, (B) examples/polling_relay.rs, the design's SELECT ... FOR UPDATE SKIP
# LOCKED loop - in a fresh database with fresh topics runs three phases of
# EVENTS events each, written by pgbench in transactions of TXN_SIZE events
# (outboxd: outbox_emit(), which deletes the row again; polling: plain
# INSERT), and an idle one:
#
#   backlog  events written while the relay is down, then the relay starts:
#            drain throughput
#   steady   written at BENCH_RATE events/s: end-to-end latency, cost at a steady rate
#   burst    written at BENCH_BURST_RATE events/s (5x steady): latency and cost under
#            load; BENCH_BURST_RATE=0 writes as fast as the pgbench clients go, which
#            on a small machine mostly measures the writers (outbox_emit() does more
#            per event than a plain INSERT) and who gets the CPU
#   idle     BENCH_IDLE_S seconds without events: what waiting costs
#
# examples/bench_consume.rs reads each phase's topic and measures arrival
# rate and latency (arrival - record timestamp: commit time for outboxd,
# created_at for the polling relay). The script samples the relay's CPU time
# and peak RSS (/proc), the CPU of the relay's PostgreSQL sessions
# (walsender, or the polling connection), of all PostgreSQL processes and of
# the broker, the WAL written and what is left in the outbox table; then it
# runs the cleanup each needs (polling: DELETE the published rows; both:
# VACUUM) and prints a table with the ratio outboxd/polling. Results and
# logs stay in BENCH_DIR.
#
# Environment:
#   BENCH_RATE=2000             steady phase, events/s
#   BENCH_BURST_RATE=10000      burst phase, events/s (0 = unthrottled)
#   BENCH_IDLE_S=5              idle phase, seconds
#   BENCH_CLIENTS=2             pgbench clients (connections) writing
#   BENCH_POLL_BATCH=100        polling relay rows per round (the design's BATCH_SIZE)
#   BENCH_POLL_INTERVAL_MS=1000 polling relay sleep after an empty round
#   BENCH_DIR=target/bench      work dir (wiped at start)
#   BENCH_SKIP_BUILD=1          use the binaries already in target/release
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

events=${1:-50000}
txn=${2:-10}
rate=${BENCH_RATE:-2000}
burst_rate=${BENCH_BURST_RATE:-10000}
idle_s=${BENCH_IDLE_S:-5}
clients=${BENCH_CLIENTS:-2}
poll_batch=${BENCH_POLL_BATCH:-100}
poll_ms=${BENCH_POLL_INTERVAL_MS:-1000}
out=${BENCH_DIR:-$root/target/bench}
[[ $events =~ ^[0-9]+$ && $txn =~ ^[0-9]+$ && $txn -gt 0 && $events -ge $txn ]] ||
  { echo "usage: scripts/bench.sh [EVENTS] [TXN_SIZE]" >&2; exit 2; }

# pgbench runs whole transactions per client: round EVENTS up to a multiple.
txn_per_client=$(((events + txn * clients - 1) / (txn * clients)))
events=$((txn_per_client * clients * txn))
tck=$(getconf CLK_TCK)

log() { echo "== $*" >&2; }

scripts/setup.sh
if [[ ${BENCH_SKIP_BUILD:-0} != 1 ]]; then
  log "building release binaries"
  cargo build --release --bin outboxd --example polling_relay --example bench_consume
fi
bin=${CARGO_TARGET_DIR:-$root/target}/release

# Wipe only what an earlier run left (a dir holding metrics.txt), never an arbitrary one.
if [[ -d $out && -n $(ls -A "$out") && ! -e $out/metrics.txt && ! -d $out/servers ]]; then
  echo "BENCH_DIR $out is not empty and not an earlier benchmark's dir; refusing to wipe it" >&2
  exit 2
fi
rm -rf "$out"
mkdir -p "$out"
# shellcheck source=scripts/lib/servers.sh
source "$root/scripts/lib/servers.sh"

relay_pid=
consumer_pid=
cleanup() {
  local pid
  for pid in $relay_pid $consumer_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  servers_stop
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "starting PostgreSQL 15 and Kafka"
servers_pg_start "$out/servers" 15 "shared_buffers = 256MB" "max_wal_size = 2GB"
servers_kafka_start "$out/servers"
log "PostgreSQL on 127.0.0.1:$PG_PORT, Kafka at $KAFKA_BROKERS"

metrics=$out/metrics.txt
: >"$metrics"
put() { echo "$1=$2" >>"$metrics"; }

# ---------------------------------------------------------------- /proc sampling

# utime+stime (+ cutime+cstime with a 2nd argument) of PID in clock ticks; 0 if gone.
ticks() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  local -a f
  read -r -a f <<<"${stat##*) }" # f[0] is field 3 (state)
  if [[ -n ${2:-} ]]; then
    echo $((f[11] + f[12] + f[13] + f[14]))
  else
    echo $((f[11] + f[12]))
  fi
}

# All PostgreSQL processes: the postmaster with its reaped children (exited
# backends: pgbench's connections, autovacuum workers) plus the live ones.
pg_ticks() {
  local sum child
  sum=$(ticks "$PG_POSTMASTER_PID" children)
  for child in $(pgrep -P "$PG_POSTMASTER_PID"); do
    sum=$((sum + $(ticks "$child")))
  done
  echo "$sum"
}

declare -A session_ticks=()
# Backends of the relay's own connections (walsender / SQL, or the polling
# connection), by application_name; a backend that has gone keeps its last value.
relay_db_ticks() { # db pattern -> $REPLY
  local db=$1 pattern=$2 pid sum=0
  for pid in $(servers_psql "$db" -At -c \
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE '$pattern'"); do
    session_ticks[$pid]=0
  done
  for pid in "${!session_ticks[@]}"; do
    if [[ -e /proc/$pid ]]; then session_ticks[$pid]=$(ticks "$pid"); fi
    sum=$((sum + session_ticks[$pid]))
  done
  REPLY=$sum
}

snap() { # kind db pattern point
  local kind=$1 db=$2 pattern=$3 point=$4
  put "$kind.$point.relay_ticks" "$([[ -n $relay_pid ]] && ticks "$relay_pid" || echo 0)"
  REPLY=0
  if [[ -n $relay_pid ]]; then relay_db_ticks "$db" "$pattern"; fi
  put "$kind.$point.relay_db_ticks" "$REPLY"
  put "$kind.$point.pg_ticks" "$(pg_ticks)"
  put "$kind.$point.kafka_ticks" "$(ticks "$KAFKA_PID")"
  put "$kind.$point.wal_bytes" "$(servers_psql "$db" -At -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")"
  put "$kind.$point.ms" "$(date +%s%3N)"
}

# ---------------------------------------------------------------- workload

# One pgbench transaction = TXN_SIZE events on 200 aggregates, ~150-byte JSON payloads.
write_events() { # kind db aggregate_type rate(0 = as fast as possible) log; sets $REPLY = transactions/s
  local kind=$1 db=$2 atype=$3 tps=$4 logf=$5
  local script=$out/$kind/$atype.sql
  local rows="'$atype', ((:agg + g) % 200)::text, 'order.created',
      jsonb_build_object('orderId', :client_id * 1000000 + g, 'amount', '100.50', 'currency', 'RUB',
                         'customer', 'c-' || :agg, 'note', 'outboxd benchmark event, steady payload text')"
  {
    echo '\set agg random(0, 199)'
    if [[ $kind == outboxd ]]; then
      echo "SELECT outbox_emit($rows) FROM generate_series(1, $txn) g;"
    else
      echo "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT $rows FROM generate_series(1, $txn) g;"
    fi
  } >"$script"
  local -a throttle=()
  if ((tps > 0)); then throttle=(-R "$tps"); fi
  pgbench -n -f "$script" -c "$clients" -j "$clients" -t "$txn_per_client" "${throttle[@]}" \
    "$PG_URL_BASE/$db" >"$logf" 2>&1 || { cat "$logf" >&2; exit 1; }
  REPLY=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$logf" | head -n1)
}

start_consumer() { # kind topic [count]
  local ready=$out/$1/$2.ready
  rm -f "$ready"
  "$bin/examples/bench_consume" --create-partitions 1 --ready-file "$ready" --idle-timeout-s 60 \
    "$KAFKA_BROKERS" "${3:-$events}" "outbox.event.$2" >"$out/$1/$2.json" 2>"$out/$1/$2.consume.log" &
  consumer_pid=$!
  local _
  for _ in $(seq 1 300); do
    [[ -e $ready ]] && return 0
    kill -0 "$consumer_pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$out/$1/$2.consume.log" >&2
  echo "bench_consume did not start" >&2
  exit 1
}

wait_consumer() { # kind topic
  local rc=0
  wait "$consumer_pid" || rc=$?
  consumer_pid=
  if [[ $rc != 0 ]]; then
    echo "warning: $1 $2: $(cat "$out/$1/$2.consume.log")" >&2
  fi
  log "$1 $2: $(cat "$out/$1/$2.json")"
}

start_relay() { # kind db [name: log dir and metrics key, default kind]
  local kind=$1 db=$2 name=${3:-$1}
  if [[ $kind == outboxd ]]; then
    cat >"$out/$kind/outboxd.toml" <<CONF
[postgres]
url = "$PG_URL_BASE/$db?sslmode=disable"
[kafka]
brokers = "$KAFKA_BROKERS"
CONF
    "$bin/outboxd" run --config "$out/$kind/outboxd.toml" 2>"$out/$name/relay.log" &
  else
    "$bin/examples/polling_relay" --pg-url "$PG_URL_BASE/$db" --brokers "$KAFKA_BROKERS" \
      --batch "$poll_batch" --poll-interval-ms "$poll_ms" 2>"$out/$name/relay.log" &
  fi
  relay_pid=$!
  put "$name.relay_start_ms" "$(date +%s%3N)"
  sleep 0.3
  if ! kill -0 "$relay_pid" 2>/dev/null; then
    cat "$out/$name/relay.log" >&2
    echo "$name: $kind exited at startup" >&2
    exit 1
  fi
}

stop_relay() { # kind
  put "$1.peak_rss_kib" "$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$relay_pid/status")"
  kill -TERM "$relay_pid"
  local rc=0
  wait "$relay_pid" || rc=$?
  relay_pid=
  [[ $rc == 0 ]] || echo "warning: $1 exited with status $rc (log: $out/$1/relay.log)" >&2
}

run() { # kind tag
  local kind=$1 tag=$2 db=bench_$2 pattern
  mkdir -p "$out/$kind"
  session_ticks=()
  log "$kind: fresh database $db, topics outbox.event.$tag-*"
  servers_psql postgres -c "CREATE DATABASE $db"
  servers_psql "$db" -f migrations/001_outbox.sql -f migrations/002_outbox_emit.sql
  if [[ $kind == outboxd ]]; then
    pattern='outboxd%'
    # The slot must exist before the backlog is written (outboxd would create it at start).
    servers_psql "$db" -f migrations/003_publication.sql \
      -c "SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput')" >/dev/null
  else
    pattern='polling_relay'
    servers_psql "$db" -c "ALTER TABLE outbox ADD COLUMN published_at timestamptz" \
      -c "CREATE INDEX outbox_unpublished ON outbox (created_at) WHERE published_at IS NULL"
  fi
  servers_psql "$db" -c CHECKPOINT
  snap "$kind" "$db" "$pattern" t0

  log "$kind backlog: writing $events events with the relay down"
  write_events "$kind" "$db" "$tag-backlog" 0 "$out/$kind/backlog.pgbench.log"
  put "$kind.backlog.writer_tps" "$REPLY"
  snap "$kind" "$db" "$pattern" t1
  start_consumer "$kind" "$tag-backlog"
  start_relay "$kind" "$db"
  wait_consumer "$kind" "$tag-backlog"
  snap "$kind" "$db" "$pattern" t2

  log "$kind steady: $events events at $rate events/s"
  start_consumer "$kind" "$tag-steady"
  put "$kind.steady.start_ms" "$(date +%s%3N)"
  write_events "$kind" "$db" "$tag-steady" $((rate / txn)) "$out/$kind/steady.pgbench.log"
  put "$kind.steady.writer_tps" "$REPLY"
  wait_consumer "$kind" "$tag-steady"
  snap "$kind" "$db" "$pattern" t3

  log "$kind burst: $events events at ${burst_rate/#0/unthrottled} events/s"
  start_consumer "$kind" "$tag-burst"
  put "$kind.burst.start_ms" "$(date +%s%3N)"
  write_events "$kind" "$db" "$tag-burst" $((burst_rate / txn)) "$out/$kind/burst.pgbench.log"
  put "$kind.burst.writer_tps" "$REPLY"
  wait_consumer "$kind" "$tag-burst"
  snap "$kind" "$db" "$pattern" t4

  log "$kind idle: ${idle_s}s without events"
  sleep "$idle_s"
  snap "$kind" "$db" "$pattern" idle

  put "$kind.rows_left" "$(servers_psql "$db" -At -c 'SELECT count(*) FROM outbox')"
  put "$kind.table_bytes" "$(servers_psql "$db" -At -c "SELECT pg_total_relation_size('outbox')")"
  stop_relay "$kind"
  if [[ $kind == outboxd ]]; then
    servers_psql "$db" -c "SELECT pg_drop_replication_slot('outboxd')" >/dev/null
  fi

  # What the table needs afterwards: the polling design a job deleting published
  # rows, both a VACUUM (outbox_emit leaves dead rows too). Timed and costed alone.
  log "$kind cleanup"
  local before started
  before=$(pg_ticks)
  started=$(date +%s%3N)
  if [[ $kind == polling ]]; then
    servers_psql "$db" -c "DELETE FROM outbox WHERE published_at IS NOT NULL"
  fi
  servers_psql "$db" -c "VACUUM outbox"
  put "$kind.cleanup_ms" $(($(date +%s%3N) - started))
  put "$kind.cleanup_ticks" $(($(pg_ticks) - before))
  put "$kind.table_bytes_vacuumed" "$(servers_psql "$db" -At -c "SELECT pg_total_relation_size('outbox')")"
  put "$kind.t5.wal_bytes" "$(servers_psql "$db" -At -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")"
}

# A fresh broker makes the first idempotent producer wait ("coordinator load in
# progress") and runs cold: warm it up with a few thousand events first, so
# that neither relay pays for it.
warmup() {
  local n=5000
  log "warming up the broker with $n events"
  mkdir -p "$out/warmup"
  servers_psql postgres -c "CREATE DATABASE bench_warmup"
  servers_psql bench_warmup -f migrations/001_outbox.sql \
    -c "ALTER TABLE outbox ADD COLUMN published_at timestamptz" \
    -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'warmup', (g % 200)::text, 'warmup', jsonb_build_object('n', g) FROM generate_series(1, $n) g"
  start_consumer warmup warmup "$n"
  start_relay polling bench_warmup warmup
  wait_consumer warmup warmup
  stop_relay warmup
  servers_psql postgres -c "DROP DATABASE bench_warmup"
}

put idle_s "$idle_s"
warmup
log "workload: $events events per phase, $txn per transaction, $clients writers, steady $rate events/s, burst ${burst_rate/#0/unthrottled}"
run outboxd a
run polling b

python3 - "$out" "$tck" "$events" "$txn" "$rate" "$clients" "$poll_batch" "$poll_ms" "$burst_rate" <<'PY' | tee "$out/results.md"
import json, sys
out, tck = sys.argv[1], int(sys.argv[2])
events, txn, rate, clients, batch, poll_ms, burst_rate = sys.argv[3:10]
m = {}
for line in open(f"{out}/metrics.txt"):
    k, _, v = line.strip().partition("=")
    m[k] = float(v) if v else 0.0
def res(kind, phase):
    tag = "a" if kind == "outboxd" else "b"
    try:
        return json.load(open(f"{out}/{kind}/{tag}-{phase}.json"))
    except Exception:
        return {"count": 0, "duplicates": 0, "throughput_eps": 0, "complete": False,
                "latency_ms": {k: 0 for k in ("p50", "p95", "p99", "max", "mean")}}
def d(kind, key, a, b):
    return m.get(f"{kind}.{b}.{key}", 0) - m.get(f"{kind}.{a}.{key}", 0)
rows = []
def row(name, f, fmt="{:,.0f}", ratio=True):
    vals = [f(k) for k in ("outboxd", "polling")]
    r = ""
    if ratio:
        r = f"{vals[0] / vals[1]:.2f}" if vals[1] else "—"
    rows.append((name, *(fmt.format(v) for v in vals), r))
phases = ("backlog", "steady", "burst")
row("events delivered (3 phases)", lambda k: sum(res(k, p)["count"] for p in phases), ratio=False)
row("duplicates", lambda k: sum(res(k, p)["duplicates"] for p in phases), ratio=False)
def drain_s(k):
    return max(res(k, "backlog").get("last_arrival_ms", 0) - m.get(f"{k}.relay_start_ms", 0), 1) / 1000
row("backlog: writer rate, relay down (events/s)", lambda k: m.get(f"{k}.backlog.writer_tps", 0) * int(txn))
row("backlog: relay start → last event (s)", drain_s, "{:.2f}")
row("backlog: drain throughput (events/s)", lambda k: res(k, "backlog")["count"] / drain_s(k))
for p in ("steady", "burst"):
    row(f"{p}: writer rate (events/s)", lambda k: m.get(f"{k}.{p}.writer_tps", 0) * int(txn))
    row(f"{p}: delivered, first write → last arrival (events/s)",
        lambda k: res(k, p)["count"] * 1000 / max(res(k, p).get("last_arrival_ms", 0) - m.get(f"{k}.{p}.start_ms", 0), 1))
    for q in ("p50", "p95", "p99", "max"):
        row(f"{p}: latency {q} (ms)", lambda k: res(k, p)["latency_ms"][q], "{:,.1f}")
row("relay CPU, total (s)", lambda k: m.get(f"{k}.t4.relay_ticks", 0) / tck, "{:.2f}")
for p, (a, b) in zip(phases, (("t1", "t2"), ("t2", "t3"), ("t3", "t4"))):
    row(f"relay CPU, {p} (s)", lambda k: d(k, "relay_ticks", a, b) / tck, "{:.2f}")
# Idle costs are at the clock tick's resolution (10 ms): no ratio.
row(f"relay CPU, idle {m.get('idle_s', 0):.0f} s (ms)", lambda k: d(k, "relay_ticks", "t4", "idle") * 1000 / tck,
    ratio=False)
row("relay peak RSS (MiB)", lambda k: m.get(f"{k}.peak_rss_kib", 0) / 1024, "{:.1f}")
row("DB CPU of the relay's sessions (s)", lambda k: m.get(f"{k}.t4.relay_db_ticks", 0) / tck, "{:.2f}")
row(f"DB CPU of the relay's sessions, idle {m.get('idle_s', 0):.0f} s (ms)",
    lambda k: d(k, "relay_db_ticks", "t4", "idle") * 1000 / tck, ratio=False)
row("DB CPU, all PostgreSQL processes (s)", lambda k: d(k, "pg_ticks", "t0", "t4") / tck, "{:.2f}")
row("DB CPU, all PostgreSQL, steady phase (s)", lambda k: d(k, "pg_ticks", "t2", "t3") / tck, "{:.2f}")
row("Kafka broker CPU (s)", lambda k: d(k, "kafka_ticks", "t0", "t4") / tck, "{:.2f}")
row("WAL written, incl. cleanup (MiB)", lambda k: d(k, "wal_bytes", "t0", "t5") / 2**20, "{:.1f}")
row("rows left in outbox", lambda k: m.get(f"{k}.rows_left", 0))
row("outbox table + indexes (MiB)", lambda k: m.get(f"{k}.table_bytes", 0) / 2**20, "{:.1f}")
row("cleanup: DELETE published (polling), VACUUM (s)", lambda k: m.get(f"{k}.cleanup_ms", 0) / 1000, "{:.2f}")
row("cleanup: DB CPU (s)", lambda k: m.get(f"{k}.cleanup_ticks", 0) / tck, "{:.2f}")
row("outbox table + indexes after cleanup (MiB)", lambda k: m.get(f"{k}.table_bytes_vacuumed", 0) / 2**20, "{:.1f}")
burst = f"{burst_rate} events/s" if burst_rate != "0" else "unthrottled"
print(f"\n{events} events per phase, {txn} per transaction, {clients} writers, steady {rate} events/s, "
      f"burst {burst}; "
      f"polling: batch {batch}, poll interval {poll_ms} ms\n")
w = [max(len(r[i]) for r in rows + [("metric", "outboxd", "polling", "ratio")]) for i in range(4)]
print(f"| {'metric':<{w[0]}} | {'outboxd':>{w[1]}} | {'polling':>{w[2]}} | {'ratio':>{w[3]}} |")
print(f"|{'-' * (w[0] + 2)}|{'-' * (w[1] + 1)}:|{'-' * (w[2] + 1)}:|{'-' * (w[3] + 1)}:|")
for r in rows:
    print(f"| {r[0]:<{w[0]}} | {r[1]:>{w[1]}} | {r[2]:>{w[2]}} | {r[3]:>{w[3]}} |")
print("\nratio = outboxd / polling")
PY
log "results and logs in $out"
