#!/usr/bin/env bash
# outboxd beside its baselines, same PostgreSQL, same Kafka, same workload, one run.
#
#   scripts/bench.sh [--baseline REV] [EVENTS]   EVENTS per drain, default 200000
#
# With BENCH_FORMATS (e.g. "json avro json-schema") the run also drains one
# backlog per transaction shape with this tree's outboxd in each of those value
# formats, in rotating order round after round, every drain on its own slot,
# against an Apicurio registry it starts (scripts/registry.sh) with the
# payload's Avro schema and JSON Schema registered (scripts/lib/formats.sh),
# and prints each format's drain rate, its ratio to json, peak RSS and the
# registry requests of each drain (targets of issue 37: avro >= 0.85 x json,
# json-schema >= 0.8 x, <= 32 MiB, a handful of requests; a miss fails the run).
#
# With --baseline REV (or BENCH_BASELINE) the run also drains one backlog per
# transaction shape with REV's outboxd (A) and this tree's (B) in alternating
# rounds, pg_recvlogical (C) after each pair, every drain on its own slot
# created before the backlog (scripts/lib/ab.sh), and prints the A/B table. The
# default REV is the last release tag (v*), else DEFAULT_BASELINE below, the
# release named in docs/benchmarks.md. BENCH_BASELINE=none skips the A/B.
#
# Builds release binaries, fetches Debezium (scripts/debezium.sh, cached), starts a
# private PostgreSQL 15 and a single Kafka broker on loopback, and runs each system in
# its own fresh database with fresh topics (6 partitions each):
#
#   outboxd      `outboxd run`, release build, default settings
#   polling      examples/polling_relay.rs, SELECT ... FOR UPDATE SKIP LOCKED every second
#   debezium     Debezium's PostgreSQL connector + Outbox EventRouter on Kafka Connect
#                standalone (the broker's Kafka version), producer matched to outboxd's
#   recvlogical  pg_recvlogical (pgoutput, outboxd's publication) to /dev/null: the
#                source ceiling, drains only
#
# Phases, for each system:
#   drain-1      EVENTS written in 1-row transactions while the system is down, then it
#                starts: drain throughput (start -> last event), start -> first event,
#                CPU per event, peak RSS
#   drain-N      the same with BENCH_BULK_TXN-row transactions (the system restarts)
#   steady-R     for each rate R of BENCH_RATES, BENCH_STEADY_S seconds of events written
#                at R events/s while it runs: latency write -> consumer (p50/p99/max)
#
# Every payload is a 374-byte JSON object whose field "t" is the writer's clock
# (microseconds); examples/bench_consume.rs measures latency from it, so every relay
# is timed from the same point whatever it puts in the record timestamp. A system
# that delivers fewer events than were written fails the run (after the table).
# The script prints a table with ratios (results.md) and draws two PNGs with gnuplot
# (installed with apt-get if missing) into BENCH_PLOT_DIR.
#
# Environment:
#   BENCH_SYSTEMS="outboxd polling debezium recvlogical"   systems to run, in this order
#                               ("" with --baseline: only the A/B)
#   BENCH_BULK_TXN=100          rows per transaction in the bulk drain
#   BENCH_RATES="1000 10000"    steady rates, events/s
#   BENCH_STEADY_S=10           seconds per steady rate
#   BENCH_STEADY_TXN=10         rows per transaction in the steady phases
#   BENCH_CLIENTS=2             pgbench clients (connections) writing
#   BENCH_WARMUP_EVENTS=5000    events through the broker before anything is
#                               measured (the polling relay's warm-up; the
#                               suite's smoke run sends fewer: it times nothing)
#   BENCH_POLL_BATCH=100        polling relay rows per round (the design's BATCH_SIZE)
#   BENCH_POLL_INTERVAL_MS=1000 polling relay sleep after an empty round
#   BENCH_DBZ_POLL_MS=500       Debezium poll.interval.ms (its default)
#   BENCH_DBZ_FLUSH_MS=60000    Kafka Connect offset.flush.interval.ms (its default)
#   BENCH_DBZ_HEAP="-Xms256m -Xmx1g"   Kafka Connect JVM heap
#   BENCH_KAFKA_HEAP="-Xms1g -Xmx1g"   the broker's JVM heap (the tests' brokers
#                               have 128 MiB to start: young collections every
#                               second would be in every latency p99)
#   BENCH_DIR=target/bench      work dir (wiped at start)
#   BENCH_PLOT_DIR=docs/benchmarks     where the PNGs go
#   BENCH_SKIP_BUILD=1          use the binaries already in target/release
#   BENCH_BIN_DIR=DIR           use the binaries in DIR (outboxd, examples/...) and
#                               build nothing: the suite's smoke run uses the
#                               debug ones (tests/ops/bench.rs)
#   BENCH_AB_ROUNDS="5 3"       A/B rounds for the 1-row and the bulk backlog
#   BENCH_BASELINE_BIN=PATH     an outboxd binary to use as the baseline (A)
#                               instead of building REV
#   BENCH_HEAD_TOML, BENCH_BASE_TOML   TOML appended to HEAD's (B) or the baseline's
#                               (A) configuration in the A/B and latency phases, `\n`
#                               for newlines; with BENCH_BASELINE_BIN=target/release/outboxd
#                               and BENCH_HEAD_TOML='[relay]\ndelivery = "exactly-once"'
#                               B is exactly-once and A at-least-once, one binary
#   BENCH_AB_STATS_MS=1000      librdkafka's statistics.interval.ms in the A/B drains;
#                               each drain's produce requests are read 1.2 periods
#                               after its last record (the suite's smoke run: 200)
#   BENCH_AB_MAX_LOSS=0.05      HEAD slower than the baseline by more than this
#                               (median drain rate of a shape) fails the run
#   BENCH_FLOOR_RATE=1000       rate of the latency phase (scripts/lib/floor.sh):
#                               outboxd beside its floor, the producer alone ("" skips it)
#   BENCH_FLOOR_SHAPES="1 10"   rows per transaction in the latency phase
#   BENCH_FLOOR_WARMUP_S=30     seconds of an unmeasured pass of each relay before it
#   BENCH_FLOOR_S=30            seconds of each measured pass of the latency phase
#   BENCH_FLOOR_LOADED=1        also the floor beside the source: the producer while the
#                               writers write and pg_recvlogical streams (0 skips it)
#   BENCH_FLOOR_THROUGH=1       also the floor through the source: the producer sending
#                               what pg_recvlogical receives, as it arrives (0 skips it)
#   BENCH_FORMATS=""            value formats to compare (json first: the ratios are
#                               to json), e.g. "json avro json-schema"; "" skips it.
#                               Only the formats: BENCH_FORMATS="json avro json-schema"
#                               BENCH_SYSTEMS= BENCH_BASELINE=none BENCH_FLOOR_RATE=
#   BENCH_FORMAT_ROUNDS="3 3"   format rounds for the 1-row and the bulk backlog
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# The release the A/B compares with when no v* tag exists (docs/benchmarks.md).
DEFAULT_BASELINE=b71d460
baseline=${BENCH_BASELINE:-}
if [[ ${1:-} == --baseline ]]; then
  [[ $# -ge 2 ]] || { echo "--baseline needs a git revision" >&2; exit 2; }
  baseline=$2
  shift 2
elif [[ ${1:-} == --baseline=* ]]; then
  baseline=${1#--baseline=}
  shift
fi
if [[ -z $baseline ]]; then
  baseline=$(git describe --tags --abbrev=0 --match 'v*' 2>/dev/null || echo "$DEFAULT_BASELINE")
fi
[[ $baseline != none ]] || baseline=
read -r ab_rounds_1 ab_rounds_bulk <<<"${BENCH_AB_ROUNDS:-5 3}"
ab_max_loss=${BENCH_AB_MAX_LOSS:-0.05}
floor_rate=${BENCH_FLOOR_RATE-1000}
formats=${BENCH_FORMATS:-}
read -r fmt_rounds_1 fmt_rounds_bulk <<<"${BENCH_FORMAT_ROUNDS:-3 3}"

events=${1:-${BENCH_EVENTS:-200000}}
systems=${BENCH_SYSTEMS-outboxd polling debezium recvlogical}
bulk=${BENCH_BULK_TXN:-100}
rates=${BENCH_RATES:-1000 10000}
steady_s=${BENCH_STEADY_S:-10}
steady_txn=${BENCH_STEADY_TXN:-10}
clients=${BENCH_CLIENTS:-2}
warmup_events=${BENCH_WARMUP_EVENTS:-5000}
poll_batch=${BENCH_POLL_BATCH:-100}
poll_ms=${BENCH_POLL_INTERVAL_MS:-1000}
dbz_poll_ms=${BENCH_DBZ_POLL_MS:-500}
dbz_flush_ms=${BENCH_DBZ_FLUSH_MS:-60000}
dbz_heap=${BENCH_DBZ_HEAP:--Xms256m -Xmx1g}
# scripts/kafka.sh reads KAFKA_HEAP when the servers start (scripts/lib/servers.sh).
export KAFKA_HEAP=${BENCH_KAFKA_HEAP:--Xms1g -Xmx1g}
out=${BENCH_DIR:-$root/target/bench}
plot_dir=${BENCH_PLOT_DIR:-$root/docs/benchmarks}
partitions=6
usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $events =~ ^[0-9]+$ && $bulk =~ ^[0-9]+$ && $bulk -gt 0 && $events -ge $((bulk * clients)) ]] || usage
[[ $warmup_events =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_WARMUP_EVENTS: a positive number of events" >&2; exit 2; }
for s in $systems; do
  [[ $s =~ ^(outboxd|polling|debezium|recvlogical)$ ]] || { echo "BENCH_SYSTEMS: unknown system $s" >&2; exit 2; }
done
for f in $formats; do
  [[ $f =~ ^(json|avro|json-schema)$ ]] || { echo "BENCH_FORMATS: unknown value format $f" >&2; exit 2; }
done
[[ -z $formats || $formats == json* ]] || { echo "BENCH_FORMATS: json goes first (the ratios are to it)" >&2; exit 2; }
tck=$(getconf CLK_TCK)

log() { echo "== $*" >&2; }

# Plots are the point of a run: get the tool before spending minutes on it
# (only the systems' table is plotted).
if [[ -n $systems ]] && ! command -v gnuplot >/dev/null; then
  log "installing gnuplot-nox (plots)"
  { apt-get install -y --no-install-recommends gnuplot-nox >/dev/null ||
    { apt-get update >/dev/null && apt-get install -y --no-install-recommends gnuplot-nox >/dev/null; }; } ||
    { echo "gnuplot is missing and apt-get could not install gnuplot-nox" >&2; exit 1; }
fi

scripts/setup.sh
if [[ ${BENCH_SKIP_BUILD:-0} != 1 && -z ${BENCH_BIN_DIR:-} ]]; then
  log "building release binaries"
  cargo build --release --bin outboxd --example polling_relay --example bench_consume --example bench_produce
fi
# shellcheck source=scripts/lib/ab.sh
source "$root/scripts/lib/ab.sh"
# shellcheck source=scripts/lib/floor.sh
source "$root/scripts/lib/floor.sh"
# shellcheck source=scripts/lib/formats.sh
source "$root/scripts/lib/formats.sh"
bin=${BENCH_BIN_DIR:-${CARGO_TARGET_DIR:-$root/target}/release}
dbz_libs=
if [[ " $systems " == *" debezium "* ]]; then dbz_libs=$(scripts/debezium.sh fetch); fi

# Wipe only what an earlier run left (a dir holding metrics.txt), never an arbitrary one.
if [[ -d $out && -n $(ls -A "$out") && ! -e $out/metrics.txt && ! -d $out/servers ]]; then
  echo "BENCH_DIR $out is not empty and not an earlier benchmark's dir; refusing to wipe it" >&2
  exit 2
fi
rm -rf "$out"
mkdir -p "$out"
# shellcheck source=scripts/lib/servers.sh
source "$root/scripts/lib/servers.sh"
# shellcheck source=scripts/lib/connect.sh
source "$root/scripts/lib/connect.sh"
# shellcheck source=scripts/lib/workload.sh
source "$root/scripts/lib/workload.sh"

relay_pid=
consumer_pid=
stop_pid() { # pid grace_s: SIGTERM, then SIGKILL after grace_s; sets $REPLY to the exit status
  local pid=$1 grace=$2 _
  REPLY=0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 $((grace * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "warning: pid $pid ignored SIGTERM for ${grace}s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || REPLY=$?
}
cleanup() {
  if [[ -n $consumer_pid ]]; then stop_pid "$consumer_pid" 5; fi
  if [[ -n $relay_pid ]]; then stop_pid "$relay_pid" 30; fi
  formats_registry_stop
  servers_stop
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "starting PostgreSQL 15 and Kafka"
# Side by side: neither needs the other until the first drain.
servers_kafka_begin "$out/servers"
# The A/B creates three slots per round before its backlog (scripts/lib/ab.sh),
# beside the systems' own: room for the larger round count and ten more.
slots=$((3 * (ab_rounds_1 > ab_rounds_bulk ? ab_rounds_1 : ab_rounds_bulk) + 10))
((slots >= 20)) || slots=20
servers_pg_start "$out/servers" 15 "shared_buffers = 256MB" "max_wal_size = 2GB" "max_replication_slots = $slots" \
  "max_wal_senders = $slots"
servers_kafka_wait
log "PostgreSQL on 127.0.0.1:$PG_PORT, Kafka at $KAFKA_BROKERS"

metrics=$out/metrics.txt
: >"$metrics"
failures=()
put() { echo "$1=$2" >>"$metrics"; }
now_ms() { date +%s%3N; }

# ---------------------------------------------------------------- workload

# Writes COUNT events (rounded up to whole transactions per client) of aggregate type
# ATYPE in TXN-row transactions, at RATE events/s (0 = as fast as pgbench goes);
# sets $REPLY to the number of events written.
write_events() { # system db atype txn count rate
  local system=$1 db=$2 atype=$3 txn=$4 count=$5 rate=$6
  local script=$out/$system/$atype.sql logf=$out/$system/$atype.pgbench.log
  local per_client=$(((count + txn * clients - 1) / (txn * clients)))
  local rows="'$atype', ((:agg + g) % 200)::text, 'order.created', $(payload_sql "$pad")"
  {
    echo '\set agg random(0, 199)'
    if [[ $system == polling ]]; then
      echo "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT $rows FROM generate_series(1, $txn) g;"
    else
      echo "SELECT outbox_emit($rows) FROM generate_series(1, $txn) g;"
    fi
  } >"$script"
  local -a throttle=()
  local commit=
  if ((rate > 0)); then
    throttle=(-R "$(((rate + txn - 1) / txn))")
  else
    # A backlog: its commits need not wait for the disk one by one (the WAL
    # is flushed before anyone reads it); 1-row transactions would otherwise
    # be written at the disk's fsync rate. Latency phases commit as usual.
    commit="-c synchronous_commit=off"
  fi
  PGOPTIONS=$commit pgbench -n -f "$script" -c "$clients" -j "$clients" -t "$per_client" "${throttle[@]}" \
    "$PG_URL_BASE/$db" >"$logf" 2>&1 || { cat "$logf" >&2; exit 1; }
  REPLY=$((per_client * clients * txn))
  local done_txn
  done_txn=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$logf")
  [[ $done_txn == $((per_client * clients)) ]] || { cat "$logf" >&2; echo "pgbench wrote $done_txn transactions" >&2; exit 1; }
  put "$system.$atype.writer_tps" "$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$logf" | head -n1)"
}

start_consumer() { # system atype count [topic] [ts_field: "-" = the record timestamp]
  local ready=$out/$1/$2.ready ts_field=${5:-t}
  local -a ts=(--ts-field "$ts_field")
  [[ $ts_field != - ]] || ts=()
  # The latency phase keeps every record's times: when the slow ones came
  # tells a relay's periodic work from the host's scheduling.
  local -a dump=()
  [[ $1 != lat ]] || dump=(--dump "$out/$1/$2.records")
  rm -f "$ready"
  "$bin/examples/bench_consume" --create-partitions "$partitions" --ready-file "$ready" --idle-timeout-s 60 \
    "${ts[@]}" "${dump[@]}" "$KAFKA_BROKERS" "$3" "${4:-outbox.event.$2}" >"$out/$1/$2.json" 2>"$out/$1/$2.consume.log" &
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

wait_consumer() { # system atype
  local rc=0
  wait "$consumer_pid" || rc=$?
  consumer_pid=
  if [[ $rc != 0 ]]; then
    failures+=("$1 $2: $(tail -n1 "$out/$1/$2.consume.log")")
    echo "FAILED: $1 $2: $(cat "$out/$1/$2.consume.log")" >&2
  elif [[ $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["duplicates"])' "$out/$1/$2.json") != 0 ]]; then
    log "note: $1 $2 delivered duplicates"
  fi
  log "$1 $2: $(cat "$out/$1/$2.json")"
}

# ---------------------------------------------------------------- systems

start_relay() { # system db
  local system=$1 db=$2 dir=$out/$1
  case $system in
    outboxd)
      cat >"$dir/outboxd.toml" <<CONF
[postgres]
url = "$PG_URL_BASE/$db?sslmode=disable"
[kafka]
brokers = "$KAFKA_BROKERS"
CONF
      "$bin/outboxd" run --config "$dir/outboxd.toml" 2>>"$dir/relay.log" &
      ;;
    polling)
      "$bin/examples/polling_relay" --pg-url "$PG_URL_BASE/$db" --brokers "$KAFKA_BROKERS" \
        --batch "$poll_batch" --poll-interval-ms "$poll_ms" 2>>"$dir/relay.log" &
      ;;
    debezium)
      # shellcheck disable=SC2086 # the heap options are words
      connect_run "$dir" "$dbz_libs" $dbz_heap >>"$dir/relay.log" 2>&1 &
      ;;
  esac
  relay_pid=$!
  sleep 0.3
  if ! kill -0 "$relay_pid" 2>/dev/null; then
    tail -n 30 "$dir/relay.log" >&2
    echo "$system exited at startup" >&2
    exit 1
  fi
}

stop_relay() { # system [log]
  stop_pid "$relay_pid" 30
  relay_pid=
  [[ $REPLY == 0 || $REPLY == 143 ]] ||
    echo "warning: $1 exited with status $REPLY (log: ${2:-$out/$1/relay.log})" >&2
}

# Kafka Connect standalone: worker and connector files. The producer is set like
# outboxd's (idempotent, acks=all, lz4, linger 5 ms), not Connect's defaults (no
# compression, linger 0).
debezium_config() { # db
  local dir=$out/debezium
  connect_files "$dir" "$1" "$dbz_flush_ms" INFO
  cat >>"$dir/worker.properties" <<CONF
producer.enable.idempotence=true
producer.acks=all
producer.compression.type=lz4
producer.linger.ms=5
CONF
  cat >>"$dir/outbox.properties" <<CONF
name=outbox
topic.prefix=bench
publication.name=outboxd
table.include.list=public.outbox
poll.interval.ms=$dbz_poll_ms
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.table.field.event.payload=payload
transforms.outbox.route.by.field=aggregate_type
transforms.outbox.route.topic.replacement=outbox.event.\${routedByValue}
transforms.outbox.table.fields.additional.placement=event_type:header:eventType,aggregate_type:header:aggregateType
CONF
}

# One drain: BACKLOG written with the system down, then it starts (and, for a relay,
# keeps running when KEEP is set).
drain() { # system db atype txn keep
  local system=$1 db=$2 atype=$3 txn=$4 keep=${5:-}
  log "$system $atype: writing $events events in $txn-row transactions, $system down"
  write_events "$system" "$db" "$atype" "$txn" "$events" 0
  local count=$REPLY
  put "$system.$atype.events" "$count"
  if [[ $system == recvlogical ]]; then
    local endpos started
    endpos=$(servers_psql "$db" -At -c "SELECT pg_current_wal_lsn()")
    # pg_recvlogical stops at the first record past --endpos: give it one.
    servers_psql "$db" -At -c "SELECT outbox_emit('end', '0', 'end', '{}')" >/dev/null
    started=$(now_ms)
    timeout 900 pg_recvlogical -d "$PG_URL_BASE/$db" -S recvlogical --start --no-loop --endpos="$endpos" \
      -o proto_version=1 -o publication_names=outboxd -f /dev/null 2>>"$out/$system/relay.log" ||
      { failures+=("$system $atype: pg_recvlogical failed"); tail -n 5 "$out/$system/relay.log" >&2; }
    put "$system.$atype.drain_ms" $(($(now_ms) - started))
    log "$system $atype: $(($(now_ms) - started)) ms"
    return
  fi
  start_consumer "$system" "$atype" "$count"
  local started
  started=$(now_ms)
  start_relay "$system" "$db"
  put "$system.$atype.start_ms" "$started"
  wait_consumer "$system" "$atype"
  put "$system.$atype.cpu_ticks" "$(ticks "$relay_pid")"
  put "$system.$atype.peak_rss_kib" "$(peak_rss_kib "$relay_pid")"
  [[ -n $keep ]] || stop_relay "$system"
}

steady() { # system db rate
  local system=$1 db=$2 rate=$3 atype=$1-steady-$3
  local count=$((rate * steady_s))
  log "$system $atype: $count events at $rate events/s"
  local t0
  t0=$(ticks "$relay_pid")
  start_consumer "$system" "$atype" "$(((count + steady_txn * clients - 1) / (steady_txn * clients) * steady_txn * clients))"
  write_events "$system" "$db" "$atype" "$steady_txn" "$count" "$rate"
  put "$system.$atype.events" "$REPLY"
  wait_consumer "$system" "$atype"
  put "$system.$atype.cpu_ticks" $(($(ticks "$relay_pid") - t0))
}

run() { # system
  local system=$1 db=bench_$1
  mkdir -p "$out/$system"
  log "$system: fresh database $db"
  servers_psql postgres -c "CREATE DATABASE $db"
  servers_psql "$db" -f migrations/001_outbox.sql -f migrations/002_outbox_emit.sql
  case $system in
    polling)
      servers_psql "$db" -c "ALTER TABLE outbox ADD COLUMN published_at timestamptz" \
        -c "CREATE INDEX outbox_unpublished ON outbox (created_at) WHERE published_at IS NULL"
      ;;
    *)
      # The slot must exist before the backlog is written (each would create it at its start).
      local slot=$system
      [[ $system != debezium ]] || debezium_config "$db"
      servers_psql "$db" -f migrations/003_publication.sql \
        -c "SELECT pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
      ;;
  esac
  servers_psql "$db" -c CHECKPOINT

  drain "$system" "$db" "$system-drain-1" 1
  servers_psql "$db" -c CHECKPOINT
  drain "$system" "$db" "$system-drain-$bulk" "$bulk" keep
  if [[ $system != recvlogical ]]; then
    local rate
    for rate in $rates; do steady "$system" "$db" "$rate"; done
    put "$system.peak_rss_kib" "$(peak_rss_kib "$relay_pid")"
    stop_relay "$system"
  fi
  [[ $system == polling ]] || servers_psql "$db" -c "SELECT pg_drop_replication_slot('$system')" >/dev/null
  servers_psql postgres -c "DROP DATABASE $db"
}

# A fresh broker makes the first idempotent producer wait ("coordinator load in
# progress") and runs cold: warm it up with a few thousand events first, so that
# no system pays for it.
warmup() {
  local n=$warmup_events
  log "warming up the broker with $n events"
  mkdir -p "$out/polling"
  servers_psql postgres -c "CREATE DATABASE bench_warmup"
  servers_psql bench_warmup -f migrations/001_outbox.sql \
    -c "ALTER TABLE outbox ADD COLUMN published_at timestamptz" \
    -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'warmup', (g % 200)::text, 'warmup', jsonb_build_object('t', 0) FROM generate_series(1, $n) g"
  start_consumer polling warmup "$n"
  start_relay polling bench_warmup
  wait_consumer polling warmup
  stop_relay polling
  servers_psql postgres -c "DROP DATABASE bench_warmup"
  : >"$out/polling/relay.log"
}

size_payload
[[ -z $baseline ]] || ab_build_baseline "$baseline"
warmup
failures=()
log "workload: $events events per drain (1-row and $bulk-row transactions), steady $rates events/s for ${steady_s}s in $steady_txn-row transactions, $clients writers, $payload_bytes-byte payloads, $partitions partitions"
for s in $systems; do run "$s"; done
if [[ -n $baseline ]]; then
  if ((ab_rounds_1 > 0)); then ab_phase 1 "$ab_rounds_1"; fi
  if ((ab_rounds_bulk > 0)); then ab_phase "$bulk" "$ab_rounds_bulk"; fi
fi
if [[ -n $floor_rate ]]; then floor_phase "$floor_rate"; fi
if [[ -n $formats ]]; then
  formats_registry_start
  if ((fmt_rounds_1 > 0)); then formats_phase 1 "$fmt_rounds_1"; fi
  if ((fmt_rounds_bulk > 0)); then formats_phase "$bulk" "$fmt_rounds_bulk"; fi
  formats_registry_stop
fi

if [[ -n $systems ]]; then
  mkdir -p "$plot_dir"
  python3 "$root/scripts/lib/bench_report.py" "$out" "$plot_dir" "$tck" "$events" "$bulk" "$rates" "$steady_s" \
    "$steady_txn" "$clients" "$poll_batch" "$poll_ms" "$dbz_poll_ms" "$dbz_flush_ms" "$systems" | tee "$out/results.md"
  gnuplot "$out/plots.gp"
  log "plots: $plot_dir/drain.png $plot_dir/latency.png"
fi
if [[ -n $baseline ]]; then
  ab_status=0
  python3 "$root/scripts/lib/ab_report.py" table "$out" "$tck" "$ab_max_loss" | tee "$out/ab.md" || ab_status=$?
  ((ab_status == 0)) || failures+=("A/B: HEAD lost more than $ab_max_loss of the baseline's drain rate, or a drain was incomplete (see $out/ab.md)")
fi
if [[ -n $floor_rate ]]; then
  python3 "$root/scripts/lib/latency_report.py" "$out" | tee "$out/latency.md"
fi
if [[ -n $formats ]]; then
  fmt_status=0
  python3 "$root/scripts/lib/formats_report.py" table "$out" "$tck" "$formats" | tee "$out/formats.md" || fmt_status=$?
  ((fmt_status == 0)) || failures+=("value formats: a target missed or a drain incomplete (see $out/formats.md)")
fi
log "results and logs in $out"
if ((${#failures[@]})); then
  printf 'FAILED: %s\n' "${failures[@]}" >&2
  exit 1
fi
