# shellcheck shell=bash
# The latency phase of scripts/bench.sh (sourced, not run): outboxd's latency
# at a steady rate beside its floor, in one run.
#
#   floor_phase RATE     for each shape of $floor_shapes (rows per transaction),
#                        $steady_s seconds at RATE events/s of:
#     head      this tree's outboxd, running and caught up, the writers writing
#     base      the A/B baseline's outboxd, the same (with --baseline only)
#     floor     examples/bench_produce.rs: the relay's producer alone (linger 0)
#               at the same pace and shape, no PostgreSQL
#     receipt   pg_recvlogical on its own slot: write -> the walsender's bytes
#               arriving, the source's share
#   The same consumer (bench_consume --ts-field t) times head, base and floor
#   from the payload's writer clock.
#
# Needs bench.sh's helpers (write_events, start_consumer, wait_consumer,
# stop_relay, put) and scripts/lib/ab.sh's $ab_base_bin and outboxd_toml.

floor_shapes=${BENCH_FLOOR_SHAPES:-1 10}

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

floor_phase() { # rate
  local rate=$1 db=bench_lat txn count
  count=$((rate * steady_s))
  mkdir -p "$out/lat"
  log "latency at $rate events/s, shapes $floor_shapes: outboxd, its floor (the producer alone) and pg_recvlogical"
  servers_psql postgres -c "CREATE DATABASE $db"
  servers_psql "$db" -f migrations/001_outbox.sql -f migrations/002_outbox_emit.sql \
    -f migrations/003_publication.sql >/dev/null
  put "lat.rate" "$rate"
  put "lat.shapes" "${floor_shapes// /,}"
  for txn in $floor_shapes; do
    local per=$((txn * clients)) n
    n=$(((count + per - 1) / per * per))
    local who
    for who in head base; do
      local binary=$bin/outboxd
      if [[ $who == base ]]; then
        [[ -n $ab_base_bin ]] || continue
        binary=$ab_base_bin
      fi
      local run=lat-$who-$txn
      floor_start_outboxd "$binary" "$db" "lat_$who" "$run" "$who"
      start_consumer lat "$run" "$n"
      write_events lat "$db" "$run" "$txn" "$count" "$rate"
      wait_consumer lat "$run"
      stop_relay "$run"
      servers_psql "$db" -c "SELECT pg_drop_replication_slot('lat_$who')" >/dev/null
    done

    local run=lat-floor-$txn
    start_consumer lat "$run" "$n" "$run"
    "$bin/examples/bench_produce" --rate "$rate" --txn "$txn" "$KAFKA_BROKERS" "$run" "$n" \
      2>>"$out/lat/$run.log" || failures+=("$run: bench_produce failed")
    wait_consumer lat "$run"

    run=lat-receipt-$txn
    servers_psql "$db" -c "SELECT pg_create_logical_replication_slot('lat_receipt', 'pgoutput')" >/dev/null
    local reader_pid
    pg_recvlogical -d "$PG_URL_BASE/$db" -S lat_receipt --start --no-loop -f - \
      -o proto_version=1 -o publication_names=outboxd 2>>"$out/lat/$run.log" |
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
    servers_psql "$db" -c "SELECT pg_drop_replication_slot('lat_receipt')" >/dev/null 2>&1 || {
      sleep 1
      servers_psql "$db" -c "SELECT pg_drop_replication_slot('lat_receipt')" >/dev/null
    }
    log "$run: $(cat "$out/lat/$run.json")"
  done
  servers_psql postgres -c "DROP DATABASE $db"
}
