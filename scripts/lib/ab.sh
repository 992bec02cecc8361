# shellcheck shell=bash
# The A/B phase of scripts/bench.sh (sourced, not run): today's outboxd (B)
# against a baseline build (A) on the same backlog, with pg_recvlogical (the
# ceiling) draining it too, all in one run.
#
#   ab_build_baseline REV   builds REV's outboxd (release) into its own target
#                           dir, once per commit; sets $ab_base_bin
#                           (BENCH_BASELINE_BIN=PATH: that binary instead)
#   outboxd_toml DB SLOT    the default configuration for DB and SLOT (stdout)
#   outboxd_extra WHO       BENCH_HEAD_TOML (WHO=head) or BENCH_BASE_TOML
#                           (WHO=base), appended to that side's configuration:
#                           e.g. BENCH_BASELINE_BIN=target/release/outboxd and
#                           BENCH_HEAD_TOML='[relay]\ndelivery = "exactly-once"'
#                           compare the two delivery modes of one binary
#   ab_phase TXN REPS       one backlog of $events events in TXN-row
#                           transactions; `outboxd check` of both sides
#                           (ab_check), then REPS rounds of A, B and the
#                           ceiling
#
# Every drain has its own slot, all created before the backlog is written, so
# each starts from the same first event and reads the same WAL. A and B
# alternate which goes first from round to round, and the ceiling drains
# after both, so a host that speeds up or slows down during the run shifts
# both alike; the ratios of a round are what to read. Each outboxd drain
# publishes to topics of its own (routing.topic), so the consumer counts only
# that drain's records. Needs bench.sh's helpers (write_events, start_consumer,
# wait_consumer, stop_relay, put, now_ms) and its variables.

ab_base_bin=
# librdkafka's statistics period in the drains (ms); the produce requests are
# read one and a fifth periods after a drain's last record.
ab_stats_ms=${BENCH_AB_STATS_MS:-1000}
[[ $ab_stats_ms =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_AB_STATS_MS: a positive number of ms" >&2; exit 2; }

# The configuration every drain starts from: the defaults but for the
# database, the slot and the broker.
outboxd_toml() { # db slot
  cat <<CONF
[postgres]
url = "$PG_URL_BASE/$1?sslmode=disable"
slot = "$2"
[kafka]
brokers = "$KAFKA_BROKERS"
CONF
}

# Extra TOML for one side of the comparison (`\n` for newlines).
outboxd_extra() { # head|base
  local extra=${BENCH_BASE_TOML:-}
  [[ $1 == head ]] && extra=${BENCH_HEAD_TOML:-}
  [[ -z $extra ]] || printf '%b\n' "$extra"
}

ab_build_baseline() { # rev
  # Two configurations (one binary in two modes, say) make the A/B a
  # comparison, not the regression check: the report says so.
  [[ ${BENCH_HEAD_TOML:-} == "${BENCH_BASE_TOML:-}" ]] || put ab.configs_differ 1
  if [[ -n ${BENCH_BASELINE_BIN:-} ]]; then
    # A binary built elsewhere (another configuration, a local experiment).
    ab_base_bin=$BENCH_BASELINE_BIN
    put ab.baseline_rev "$ab_base_bin"
    put ab.head_rev "$(git -C "$root" rev-parse --short HEAD)"
    return
  fi
  local rev
  rev=$(git -C "$root" rev-parse --verify --quiet "$1^{commit}") ||
    { echo "--baseline $1: no such commit in this repository" >&2; exit 2; }
  local dir=${CARGO_TARGET_DIR:-$root/target}/baseline/$rev
  ab_base_bin=$dir/target/release/outboxd
  put ab.baseline_rev "$(git -C "$root" rev-parse --short "$rev")"
  put ab.head_rev "$(git -C "$root" rev-parse --short HEAD)$([[ -z $(git -C "$root" status --porcelain -- src Cargo.toml Cargo.lock) ]] || echo +changes)"
  if [[ -x $ab_base_bin ]]; then
    log "baseline $rev: already built"
    return
  fi
  # Revisions before GSSAPI became an opt-in feature need the SASL headers,
  # and those before curl-static libcurl's.
  OUTBOXD_FEATURES=gssapi,system-curl scripts/setup.sh >/dev/null
  log "building the baseline $rev (release) in $dir"
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  git -C "$root" archive "$rev" | tar -x -C "$dir/src"
  (cd "$dir/src" && CARGO_TARGET_DIR=$dir/target cargo build --release --locked --bin outboxd) \
    >"$dir/build.log" 2>&1 || { tail -n 30 "$dir/build.log" >&2; echo "the baseline did not build" >&2; exit 1; }
}

# One outboxd drain of slot SLOT by BINARY into topic prefix RUN; records
# RUN's figures.
ab_drain_outboxd() { # binary db slot run count who
  local binary=$1 db=$2 slot=$3 run=$4 count=$5 who=$6 dir=$out/ab
  local port
  port=$(servers_free_port)
  # Metrics on, statistics every $ab_stats_ms ms: the produce requests of the drain
  # are read from /metrics at its end (a build without that counter gives 0).
  outboxd_toml "$db" "$slot" >"$dir/$run.toml"
  cat >>"$dir/$run.toml" <<CONF
[routing]
topic = "$run.\${aggregate_type}"
[metrics]
listen = "127.0.0.1:$port"
CONF
  # One [kafka.properties] table: the experiment's own, if it has one
  # (BENCH_HEAD_TOML / BENCH_BASE_TOML), with the statistics period added.
  local extra stats="\"statistics.interval.ms\" = \"$ab_stats_ms\""
  extra=$(outboxd_extra "$who")
  if grep -qx '\[kafka\.properties\]' <<<"$extra"; then
    awk -v stats="$stats" '{ print } $0 == "[kafka.properties]" { print stats }' <<<"$extra" >>"$dir/$run.toml"
  else
    printf '[kafka.properties]\n%s\n%s\n' "$stats" "$extra" >>"$dir/$run.toml"
  fi
  start_consumer ab "$run" "$count" "$run.ab"
  local started host0 broker0
  host0=$(host_ticks)
  broker0=$(ticks "$KAFKA_PID")
  started=$(now_ms)
  "$binary" run --config "$dir/$run.toml" 2>>"$dir/$run.relay.log" &
  relay_pid=$!
  put "$run.start_ms" "$started"
  sleep 0.3
  kill -0 "$relay_pid" 2>/dev/null || { tail -n 30 "$dir/$run.relay.log" >&2; echo "$run: outboxd exited at startup" >&2; exit 1; }
  wait_consumer ab "$run"
  put "$run.cpu_ticks" "$(ticks "$relay_pid")"
  put "$run.peak_rss_kib" "$(peak_rss_kib "$relay_pid")"
  # Where the host's two cores went: the broker, the walsender (its own
  # process for this connection) and the host as a whole.
  ab_put_host "$run" "$host0"
  put "$run.broker_ticks" $(($(ticks "$KAFKA_PID") - broker0))
  local walsender
  walsender=$(servers_psql "$db" -At -c \
    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '$slot'")
  put "$run.walsender_ticks" "$(ticks "${walsender:-0}")"
  sleep "$(awk -v ms="$ab_stats_ms" 'BEGIN { print ms * 1.2 / 1000 }')"
  put "$run.produce_requests" "$(curl -s "http://127.0.0.1:$port/metrics" |
    awk '/^outboxd_kafka_produce_requests_total/ { n += $2 } END { print n + 0 }')"
  stop_relay "$run" "$dir/$run.relay.log"
}

ab_drain_ceiling() { # db slot run endpos
  local db=$1 slot=$2 run=$3 endpos=$4 started host0
  host0=$(host_ticks)
  started=$(now_ms)
  timeout 900 pg_recvlogical -d "$PG_URL_BASE/$db" -S "$slot" --start --no-loop --endpos="$endpos" \
    -o proto_version=1 -o publication_names=outboxd -f /dev/null 2>>"$out/ab/$run.log" ||
    { failures+=("$run: pg_recvlogical failed"); tail -n 5 "$out/ab/$run.log" >&2; }
  put "$run.drain_ms" $(($(now_ms) - started))
  ab_put_host "$run" "$host0"
}

# The host's busy and total CPU ticks since HOST0 (host_ticks' output).
ab_put_host() { # run host0
  local -a was now
  read -r -a was <<<"$2"
  read -r -a now <<<"$(host_ticks)"
  put "$1.host_busy_ticks" $((now[0] - was[0]))
  put "$1.host_ticks" $((now[1] - was[1]))
}

# `outboxd check` for each side, as an operator runs it before a first
# start. Its output is kept, not judged: the drains judge. In exactly-once it
# also initialises a probe transactional id, and on a new cluster that
# creates Kafka's transaction state log, a one-off that otherwise fell on
# the first exactly-once drain (COORDINATOR_NOT_AVAILABLE, then librdkafka's
# retry: a large share of a short drain; docs/benchmarks.md, "Exactly-once
# start-up").
ab_check() { # db
  local who binary
  for who in base head; do
    binary=$bin/outboxd
    [[ $who == head ]] || binary=$ab_base_bin
    { outboxd_toml "$1" "ab_${who}_1"; outboxd_extra "$who"; } >"$out/ab/check-$who.toml"
    "$binary" check --config "$out/ab/check-$who.toml" >>"$out/ab/check-$who.log" 2>&1 || true
  done
}

ab_phase() { # txn reps
  local txn=$1 reps=$2 db=bench_ab_$1 i
  mkdir -p "$out/ab"
  log "A/B, $txn-row transactions: $reps rounds of baseline, HEAD and pg_recvlogical on one backlog"
  servers_psql postgres -c "CREATE DATABASE $db"
  servers_psql "$db" -f migrations/001_outbox.sql -f migrations/002_outbox_emit.sql \
    -f migrations/003_publication.sql >/dev/null
  for i in $(seq 1 "$reps"); do
    servers_psql "$db" -c "SELECT pg_create_logical_replication_slot('ab_base_$i', 'pgoutput')" \
      -c "SELECT pg_create_logical_replication_slot('ab_head_$i', 'pgoutput')" \
      -c "SELECT pg_create_logical_replication_slot('ab_ceiling_$i', 'pgoutput')" >/dev/null
  done
  servers_psql "$db" -c CHECKPOINT
  # aggregate_type "ab": each drain's topic is "<run>.ab".
  write_events ab "$db" ab "$txn" "$events" 0
  local count=$REPLY endpos
  put "ab.$txn.events" "$count"
  put "ab.$txn.reps" "$reps"
  endpos=$(servers_psql "$db" -At -c "SELECT pg_current_wal_lsn()")
  # pg_recvlogical stops at the first record past --endpos: give it one.
  servers_psql "$db" -At -c "SELECT outbox_emit('end', '0', 'end', '{}')" >/dev/null
  servers_psql "$db" -c CHECKPOINT
  ab_check "$db"
  for i in $(seq 1 "$reps"); do
    local first=base second=head
    if ((i % 2 == 0)); then first=head second=base; fi
    local who
    for who in $first $second; do
      local binary=$bin/outboxd
      [[ $who == head ]] || binary=$ab_base_bin
      ab_drain_outboxd "$binary" "$db" "ab_${who}_$i" "ab-$txn-$who-$i" "$count" "$who"
    done
    ab_drain_ceiling "$db" "ab_ceiling_$i" "ab-$txn-ceiling-$i" "$endpos"
    log "A/B $txn-row round $i: $(python3 "$root/scripts/lib/ab_report.py" round "$out" "$tck" "$txn" "$i")"
  done
  servers_psql "$db" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
    WHERE database = '$db'" >/dev/null
  servers_psql postgres -c "DROP DATABASE $db"
}
