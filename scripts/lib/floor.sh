# shellcheck shell=bash
# The latency phase of scripts/bench.sh (sourced, not run): outboxd's latency
# at a steady rate beside its floor, in one run.
#
#   floor_phase RATE     for each shape of $floor_shapes (rows per transaction),
#                        $floor_s seconds at RATE events/s of:
#     head      this tree's outboxd, running and caught up, the writers writing
#     base      the A/B baseline's outboxd, the same (with --baseline only)
#     floor     examples/bench_produce.rs: the relay's producer alone (linger 0)
#               at the same pace and shape, no PostgreSQL
#     loaded    the same producer while the writers write the same rows and
#               pg_recvlogical streams them: the floor beside the source
#               (BENCH_FLOOR_LOADED=0 skips it)
#     through   the floor through the source: pg_recvlogical streams the
#               writers' rows into the same producer, which sends each
#               payload as it arrives (bench_produce --through-source): the
#               source's hand-over and the producer alone in series, record
#               by record (BENCH_FLOOR_THROUGH=0 skips it)
#     receipt   pg_recvlogical on its own slot: write -> the walsender's bytes
#               arriving, the source's share
#   The same consumer (bench_consume --ts-field t) times head, base and the
#   floors from the payload's writer clock.
#
# Needs bench.sh's helpers (write_events, start_consumer, wait_consumer,
# stop_relay, put) and scripts/lib/ab.sh's $ab_base_bin and outboxd_toml.

floor_shapes=${BENCH_FLOOR_SHAPES:-1 10}
# 30 s, not 5: after 5 s passes the first relay measured still paid for the
# warm-up, in 5 of 5 pairs on one host (1-row p99 1.1-4.3 ms above the
# second, whichever binary went first); after 30 s passes it did not
# (docs/benchmarks-journal.md, 2026-12-06).
floor_warmup_s=${BENCH_FLOOR_WARMUP_S:-30}
# Long enough that a stall of a few hundred ms at a pass's start, which every
# system shows (the producer alone too), stays below its p99.
floor_s=${BENCH_FLOOR_S:-30}

# A relay on a slot made now (so it sees only what follows), caught up.
floor_start_outboxd() { # binary db slot run who
  local binary=$1 db=$2 slot=$3 run=$4 who=$5 dir=$out/lat _
  servers_psql "$db" -c "SELECT pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
  outboxd_toml "$db" "$slot" >"$dir/$run.toml"
  outboxd_extra "$who" >>"$dir/$run.toml"
  "$binary" run --config "$dir/$run.toml" 2>>"$dir/$run.relay.log" &
  relay_pid=$!
  for _ in $(seq 1 100); do
    [[ $(servers_psql "$db" -At -c "SELECT active FROM pg_replication_slots WHERE slot_name = '$slot'") == t ]] &&
      break
    kill -0 "$relay_pid" 2>/dev/null || { tail -n 30 "$dir/$run.relay.log" >&2; echo "$run: outboxd exited" >&2; exit 1; }
    sleep 0.1
  done
  # The producer connects in the background: give it its broker.
  sleep 1
}

# One relay's pass: COUNT events at RATE in TXN-row transactions, timed by
# the consumer as RUN.
floor_relay_pass() { # head|base db txn count rate run
  local who=$1 db=$2 txn=$3 count=$4 rate=$5 run=$6 binary=$bin/outboxd
  local per=$((txn * clients)) n
  n=$(((count + per - 1) / per * per))
  if [[ $who == base ]]; then
    [[ -n $ab_base_bin ]] || return 0
    binary=$ab_base_bin
  fi
  # A slot of its own per pass: exactly-once keeps its ledger under the
  # slot's name, and a new slot of an old name is confirmed past that
  # ledger, which the relay refuses as a gap.
  local slot=${run//-/_}
  floor_start_outboxd "$binary" "$db" "$slot" "$run" "$who"
  start_consumer lat "$run" "$n"
  write_events lat "$db" "$run" "$txn" "$count" "$rate"
  wait_consumer lat "$run"
  stop_relay "$run" "$out/lat/$run.relay.log"
  servers_psql "$db" -c "SELECT pg_drop_replication_slot('$slot')" >/dev/null
}

# pg_recvlogical streaming slot SLOT of DB (pgoutput, the relays'
# publication) into FILE ("-": stdout), until killed (by name: run in the
# background it is a subshell's child, which `kill $!` would miss).
floor_recvlogical() { # db slot file
  pg_recvlogical -d "$PG_URL_BASE/$1" -S "$2" --start --no-loop -f "$3" \
    -o proto_version=1 -o publication_names=outboxd
}

# Drops a slot its pg_recvlogical just left: the walsender may not have
# released it yet, so once more a second later.
floor_drop_slot() { # db slot
  servers_psql "$1" -c "SELECT pg_drop_replication_slot('$2')" >/dev/null 2>&1 || {
    sleep 1
    servers_psql "$1" -c "SELECT pg_drop_replication_slot('$2')" >/dev/null
  }
}

floor_phase() { # rate
  local rate=$1 db=bench_lat txn count
  count=$((rate * floor_s))
  mkdir -p "$out/lat"
  log "latency at $rate events/s, shapes $floor_shapes: outboxd, its floor (the producer alone) and pg_recvlogical"
  servers_psql postgres -c "CREATE DATABASE $db"
  servers_psql "$db" -f migrations/001_outbox.sql -f migrations/002_outbox_emit.sql \
    -f migrations/003_publication.sql >/dev/null
  put "lat.rate" "$rate"
  put "lat.shapes" "${floor_shapes// /,}"
  # One unmeasured pass of each relay first: the first system measured on
  # a fresh broker otherwise pays for its JIT (and, exactly-once, for the
  # transaction coordinator's first transactions), which swamps its p99
  # (docs/benchmarks.md, "How to read a run"). The order then alternates
  # shape by shape.
  local warm_txn=${floor_shapes%% *} order="head base" who
  for who in head base; do
    floor_relay_pass "$who" "$db" "$warm_txn" "$((rate * floor_warmup_s))" "$rate" lat-warm-$who-$warm_txn
  done
  for txn in $floor_shapes; do
    for who in $order; do
      floor_relay_pass "$who" "$db" "$txn" "$count" "$rate" lat-$who-$txn
    done
    [[ $order == "head base" ]] && order="base head" || order="head base"

    local per=$((txn * clients)) n
    n=$(((count + per - 1) / per * per))

    local run=lat-floor-$txn
    start_consumer lat "$run" "$n" "$run"
    "$bin/examples/bench_produce" --rate "$rate" --txn "$txn" "$KAFKA_BROKERS" "$run" "$n" \
      2>>"$out/lat/$run.log" || failures+=("$run: bench_produce failed")
    wait_consumer lat "$run"

    # The floor beside the source: the same producer while the writers
    # write the same rows and pg_recvlogical streams them, so the host's
    # cores carry what they carry under a relay, less the relay itself.
    # The plain floor has the cores to itself and the broker; on a 2-core
    # host the writers and the walsender alone raised its 1-row p99 by 3.6
    # ms (docs/benchmarks-journal.md, 2026-12-06, morning).
    if [[ ${BENCH_FLOOR_LOADED:-1} == 1 ]]; then
      run=lat-loaded-$txn
      servers_psql "$db" -c "SELECT pg_create_logical_replication_slot('lat_loaded', 'pgoutput')" >/dev/null
      floor_recvlogical "$db" lat_loaded /dev/null 2>>"$out/lat/$run.log" &
      local loaded_reader=$! producer_pid
      start_consumer lat "$run" "$n" "$run"
      "$bin/examples/bench_produce" --rate "$rate" --txn "$txn" "$KAFKA_BROKERS" "$run" "$n" \
        2>>"$out/lat/$run.log" &
      producer_pid=$!
      write_events lat "$db" "$run-writers" "$txn" "$count" "$rate"
      wait "$producer_pid" || failures+=("$run: bench_produce failed")
      wait_consumer lat "$run"
      # By name: the job is the subshell that runs floor_recvlogical.
      pkill -f "pg_recvlogical.*-S lat_loaded" 2>/dev/null || true
      wait "$loaded_reader" 2>/dev/null || true
      floor_drop_slot "$db" lat_loaded
    fi

    # The floor through the source: PostgreSQL's hand-over to a replication
    # client and then the producer alone, in series for each record, on the
    # same loaded cores. A pgoutput relay cannot beat it; the other two
    # floors leave out the hand-over (0.4-1.1 ms at p50 here, the receipt
    # column), which is in series with everything a relay does.
    if [[ ${BENCH_FLOOR_THROUGH:-1} == 1 ]]; then
      run=lat-through-$txn
      local ready=$out/lat/$run.producer-ready status=$out/lat/$run.producer-status through_pid
      rm -f "$ready" "$status"
      servers_psql "$db" -c "SELECT pg_create_logical_replication_slot('lat_through', 'pgoutput')" >/dev/null
      start_consumer lat "$run" "$n" "$run"
      # The producer's own status, not the pipeline's: pg_recvlogical ends
      # killed.
      floor_recvlogical "$db" lat_through - 2>>"$out/lat/$run.log" | {
        "$bin/examples/bench_produce" --through-source --ready-file "$ready" "$KAFKA_BROKERS" "$run" "$n" \
          2>>"$out/lat/$run.log"
        echo $? >"$status"
      } &
      through_pid=$!
      for _ in $(seq 1 300); do
        [[ -e $ready ]] && break
        sleep 0.1
      done
      [[ -e $ready ]] || failures+=("$run: bench_produce did not connect")
      write_events lat "$db" "$run-writers" "$txn" "$count" "$rate"
      wait_consumer lat "$run"
      # The producer exits at its count; pg_recvlogical streams on until told.
      pkill -f "pg_recvlogical.*-S lat_through" 2>/dev/null || true
      wait "$through_pid" 2>/dev/null || true
      [[ $(cat "$status" 2>/dev/null) == 0 ]] ||
        failures+=("$run: bench_produce --through-source failed ($(tail -n1 "$out/lat/$run.log"))")
      floor_drop_slot "$db" lat_through
    fi

    run=lat-receipt-$txn
    servers_psql "$db" -c "SELECT pg_create_logical_replication_slot('lat_receipt', 'pgoutput')" >/dev/null
    local reader_pid
    floor_recvlogical "$db" lat_receipt - 2>>"$out/lat/$run.log" |
      python3 "$root/scripts/lib/receipt_latency.py" "$n" >"$out/lat/$run.json" 2>>"$out/lat/$run.log" &
    reader_pid=$!
    sleep 1
    write_events lat "$db" "$run" "$txn" "$count" "$rate"
    # The reader stops at its count; pg_recvlogical streams on until told,
    # and `wait` waits for the whole pipeline.
    local _
    for _ in $(seq 1 300); do
      [[ -s $out/lat/$run.json ]] && break
      sleep 0.1
    done
    pkill -f "pg_recvlogical.*-S lat_receipt" 2>/dev/null || true
    wait "$reader_pid" 2>/dev/null || true
    grep -q '"complete": true' "$out/lat/$run.json" 2>/dev/null ||
      failures+=("$run: pg_recvlogical's reader failed ($(tail -n1 "$out/lat/$run.log"))")
    floor_drop_slot "$db" lat_receipt
    log "$run: $(cat "$out/lat/$run.json")"
  done
  servers_psql postgres -c "DROP DATABASE $db"
}
