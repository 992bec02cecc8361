#!/usr/bin/env bash
# Where the CPU goes while outboxd drains a backlog: per process (walsender,
# Kafka broker, outboxd, the consumer) and, with perf, inside outboxd.
#
#   scripts/profile.sh [EVENTS] [ROWS_PER_TXN]     default 200000 events, 100 rows
#
# Starts a private PostgreSQL 15 and Kafka broker (as scripts/bench.sh does),
# writes the backlog while outboxd is down, then starts the release outboxd
# with its default settings and a consumer, and prints each process's CPU
# seconds and CPU per event from its start to the last event. With perf on
# the PATH (Debian's linux-perf) it also records outboxd with call graphs:
# PROFILE_DIR/perf.data, and the top of `perf report` in PROFILE_DIR/report.txt.
#
# With PROFILE_RATE=R it runs outboxd under a steady R events/s for
# PROFILE_STEADY_S (10) seconds instead, in ROWS_PER_TXN-row transactions.
#
# Environment: PROFILE_DIR (default target/profile, wiped), PROFILE_ROUNDS (measured
# drains, default 1; perf records the last), PROFILE_PERF=0 to
# skip perf, BENCH_SKIP_BUILD=1 to use target/release as it is, OUTBOXD_TOML
# extra lines for outboxd's [kafka.properties] (e.g. 'compression.type = "none"'),
# PROFILE_BIN another outboxd binary to profile (e.g. a baseline built by
# scripts/bench.sh --baseline, under target/baseline/<rev>/target/release).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
events=${1:-200000}
txn=${2:-100}
out=${PROFILE_DIR:-$root/target/profile}
clients=2
partitions=6

scripts/setup.sh >/dev/null
if [[ ${BENCH_SKIP_BUILD:-0} != 1 ]]; then
  cargo build --release --bin outboxd --example bench_consume
fi
bin=${CARGO_TARGET_DIR:-$root/target}/release
relay_bin=${PROFILE_BIN:-$bin/outboxd}
rm -rf "$out"
mkdir -p "$out"
# shellcheck source=scripts/lib/servers.sh
source "$root/scripts/lib/servers.sh"
# shellcheck source=scripts/lib/workload.sh
source "$root/scripts/lib/workload.sh"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; servers_stop' EXIT
servers_pg_start "$out/servers" 15 "shared_buffers = 256MB" "max_wal_size = 2GB"
servers_kafka_start "$out/servers"
servers_psql postgres -c "CREATE DATABASE prof"
servers_psql prof -f migrations/001_outbox.sql -f migrations/002_outbox_emit.sql \
  -f migrations/003_publication.sql \
  -c "SELECT pg_create_logical_replication_slot('outboxd', 'pgoutput')" >/dev/null

# The payload scripts/bench.sh writes: 374 bytes of JSON over 200 aggregates.
size_payload
{
  echo '\set agg random(0, 199)'
  echo "SELECT outbox_emit('@ATYPE@', ((:agg + g) % 200)::text, 'order.created', $(payload_sql "$pad"))"
  echo "  FROM generate_series(1, :txn) g;"
} >"$out/write.sql.in"
metrics_port=$(servers_free_port)
cat >"$out/outboxd.toml" <<CONF
[metrics]
listen = "127.0.0.1:$metrics_port"
[postgres]
url = "$PG_URL_BASE/prof?sslmode=disable"
[kafka]
brokers = "$KAFKA_BROKERS"
[kafka.properties]
# Statistics every second (default 5 s), so that a drain's last produce
# requests are counted before it is stopped.
"statistics.interval.ms" = "1000"
${OUTBOXD_TOML:-}
CONF
tck=$(getconf CLK_TCK)

# Writes COUNT events of aggregate type ATYPE while outboxd is down, then
# drains them; with REPORT, prints the CPU split (and records perf).
drain() { # atype count report
  local atype=$1 count=$2 report=${3:-}
  local per_client=$(((count + txn * clients - 1) / (txn * clients)))
  count=$((per_client * clients * txn))
  sed "s/@ATYPE@/$atype/" "$out/write.sql.in" >"$out/$atype.sql"
  # A backlog: commits need not wait for the disk one by one (as in bench.sh).
  PGOPTIONS="-c synchronous_commit=off" pgbench -n -D txn="$txn" -f "$out/$atype.sql" -c "$clients" -j "$clients" -t "$per_client" \
    "$PG_URL_BASE/prof" >"$out/$atype.pgbench.log" 2>&1 || { tail -n 5 "$out/$atype.pgbench.log" >&2; exit 1; }
  servers_psql prof -c CHECKPOINT
  rm -f "$out/ready"
  "$bin/examples/bench_consume" --create-partitions "$partitions" --ready-file "$out/ready" \
    --ts-field t "$KAFKA_BROKERS" "$count" "outbox.event.$atype" >"$out/$atype.json" 2>"$out/$atype.log" &
  local consumer=$!
  pids+=("$consumer")
  until [[ -e $out/ready ]]; do sleep 0.1; done
  local broker0 started relay perf_pid= walsender=
  broker0=$(ticks "$KAFKA_PID")
  started=$(date +%s%3N)
  echo "== outboxd started at $(date -u +%H:%M:%S.%N)" >>"$out/relay.log"
  "$relay_bin" run --config "$out/outboxd.toml" 2>>"$out/relay.log" &
  relay=$!
  pids+=("$relay")
  if [[ -n $report && ${PROFILE_PERF:-1} != 0 ]] && command -v perf >/dev/null; then
    perf record -F 999 -g --call-graph dwarf,16384 -o "$out/perf.data" -p "$relay" 2>"$out/perf.log" &
    perf_pid=$!
  fi
  for _ in $(seq 1 100); do
    walsender=$(servers_psql prof -At -c "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outboxd'")
    [[ -n $walsender ]] && break
    sleep 0.05
  done
  # Sampled while they live: the walsender ends with the relay, the consumer
  # at its last record.
  local wal0 wal_last cons0 cons_last
  wal0=$(ticks "$walsender"); wal_last=$wal0
  cons0=$(ticks "$consumer"); cons_last=$cons0
  local t
  while kill -0 "$consumer" 2>/dev/null; do
    t=$(ticks "$walsender"); ((t == 0)) || wal_last=$t
    t=$(ticks "$consumer"); ((t == 0)) || cons_last=$t
    sleep 0.2
  done
  wait "$consumer" || true
  local ended relay_ticks broker_ticks
  ended=$(date +%s%3N)
  relay_ticks=$(ticks "$relay")
  broker_ticks=$(($(ticks "$KAFKA_PID") - broker0))
  local threads hwm
  hwm=$(peak_rss_kib "$relay")
  grep -E "^(VmHWM|VmRSS|RssAnon|RssFile)" "/proc/$relay/status" | tr -s " \t" " " | paste -sd" " >&2
  threads=$(for t in /proc/"$relay"/task/*; do echo "$(cat "$t/comm")=$(ticks "${t#/proc/}")"; done)
  [[ -z $perf_pid ]] || { kill -INT "$perf_pid"; wait "$perf_pid" || true; }
  local requests=0
  if [[ -n $report ]]; then
    # How full the produce requests were: one statistics interval later,
    # every request of the drain is counted.
    sleep 1.2
    requests=$(curl -s "http://127.0.0.1:$metrics_port/metrics" |
      awk '/^outboxd_kafka_produce_requests_total/ { n += $2 } END { print n + 0 }')
  fi
  kill "$relay"
  wait "$relay" || true
  [[ -n $report ]] || return 0
  if ((requests > 0)); then
    echo "produce requests: $requests, $(python3 -c "print(f'{$count / $requests:.1f}')") events per request"
  fi
  python3 - "$count" "$((ended - started))" "$tck" "$relay_ticks" "$((wal_last - wal0))" \
    "$broker_ticks" "$((cons_last - cons0))" "$threads" <<'PY'
import sys
events, span_ms, tck = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
print(f"{events} events in {span_ms} ms: {events / span_ms * 1000:,.0f} events/s (start to last event)")
for name, t in zip(["outboxd", "walsender", "broker", "consumer"], map(int, sys.argv[4:8])):
    s = t / tck
    print(f"{name:10} {s:6.2f} s CPU  {s / events * 1e6:6.1f} µs/event  {s / (span_ms / 1000):5.2f} cores")
threads = {}
for line in sys.argv[8].splitlines():
    name, t = line.rsplit("=", 1)
    threads[name] = threads.get(name, 0) + int(t)
for name, t in sorted(threads.items(), key=lambda kv: -kv[1]):
    if t:
        print(f"  outboxd thread {name:18} {t / tck:6.2f} s CPU  {t / tck / (span_ms / 1000):5.2f} cores")
PY
  echo "outboxd peak RSS $((hwm / 1024)) MiB"
  cat "$out/$atype.json"
}

# A fresh broker runs cold (JIT, the first idempotent producer's wait): warm
# it up first, as scripts/bench.sh does.
echo "== warming up with 20000 events" >&2
drain warmup 20000
if [[ -n ${PROFILE_RATE:-} ]]; then
  # Steady load instead of drains: outboxd runs while pgbench writes at
  # PROFILE_RATE events/s for PROFILE_STEADY_S seconds.
  steady_s=${PROFILE_STEADY_S:-10}
  count=$((PROFILE_RATE * steady_s / txn / clients * txn * clients))
  sed "s/@ATYPE@/steady/" "$out/write.sql.in" >"$out/steady.sql"
  rm -f "$out/ready"
  "$bin/examples/bench_consume" --create-partitions "$partitions" --ready-file "$out/ready" \
    --ts-field t "$KAFKA_BROKERS" "$count" outbox.event.steady >"$out/steady.json" 2>"$out/steady.log" &
  consumer=$!
  pids+=("$consumer")
  until [[ -e $out/ready ]]; do sleep 0.1; done
  "$relay_bin" run --config "$out/outboxd.toml" 2>>"$out/relay.log" &
  relay=$!
  pids+=("$relay")
  sleep 2
  # Per thread: CPU ticks and context switches, before and after.
  per_thread() {
    for t in /proc/"$relay"/task/*; do
      echo "$(cat "$t/comm") $(ticks "${t#/proc/}") $(sed -n 's/^voluntary_ctxt_switches:\s*//p' "$t/status")"
    done
  }
  threads0=$(per_thread)
  r0=$(ticks "$relay")
  perf_pid=
  if [[ ${PROFILE_PERF:-1} != 0 ]] && command -v perf >/dev/null; then
    perf record -F 999 -g --call-graph dwarf,16384 -o "$out/perf.data" -p "$relay" 2>"$out/perf.log" &
    perf_pid=$!
  fi
  # librdkafka's own split of a record's wait (queue, request queue, round
  # trip) is a window of the last statistics interval: sampled mid-load.
  (sleep $((steady_s / 2)) && curl -s "http://127.0.0.1:$metrics_port/metrics" >"$out/steady.mid.metrics") &
  pgbench -n -D txn="$txn" -f "$out/steady.sql" -c "$clients" -j "$clients" \
    -t $((count / txn / clients)) -R $((PROFILE_RATE / txn)) "$PG_URL_BASE/prof" >"$out/steady.pgbench.log" 2>&1
  wait "$consumer" || true
  r1=$(ticks "$relay")
  threads1=$(per_thread)
  [[ -z $perf_pid ]] || { kill -INT "$perf_pid"; wait "$perf_pid" || true; }
  echo "outboxd: $(((r1 - r0) * 1000000 / tck / count)) µs CPU per event at $PROFILE_RATE events/s"
  python3 - "$threads0" "$threads1" "$tck" "$count" <<'PY'
import sys
def parse(text):
    out = {}
    for line in text.splitlines():
        name, t, cs = line.rsplit(" ", 2)
        a = out.setdefault(name, [0, 0])
        a[0] += int(t); a[1] += int(cs or 0)
    return out
before, after, tck, n = parse(sys.argv[1]), parse(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for name, (t, cs) in sorted(after.items(), key=lambda kv: -kv[1][0]):
    t0, cs0 = before.get(name, [0, 0])
    print(f"  thread {name:18} {(t - t0) / tck * 1e6 / n:7.1f} µs CPU/event  {(cs - cs0) / n:6.2f} wake-ups/event")
PY
  grep -E "latency average|tps" "$out/steady.pgbench.log"
  # outboxd's own view: commit -> Kafka ack, and WAL received -> ack.
  curl -s "http://127.0.0.1:$metrics_port/metrics" |
    grep -E '^outboxd_((commit|wal_receive)_to_ack_seconds_(bucket|count)|kafka_broker_rtt)' | grep -v 'le="[0-9.]*[1-9][0-9]\.' || true
  echo "mid-load, librdkafka's last statistics window (seconds):"
  grep -E '^outboxd_kafka_(queue_latency|request_queue_latency|request_rtt)_seconds' "$out/steady.mid.metrics" || true
  cat "$out/steady.json"
else
  for round in $(seq 1 "${PROFILE_ROUNDS:-1}"); do
    echo "== round $round: $events events in $txn-row transactions" >&2
    drain "prof$round" "$events" report
  done
fi
if [[ ${PROFILE_PERF:-1} != 0 ]] && [[ -e $out/perf.data ]]; then
  perf report -i "$out/perf.data" --no-children --sort sym --stdio -g none --percent-limit 0.5 2>/dev/null |
    grep -v '^#' | grep -v '^$' | head -n 80 >"$out/report.txt" || true
  echo "== perf: $out/perf.data (last round), top symbols in $out/report.txt" >&2
fi
