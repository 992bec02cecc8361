# shellcheck shell=bash
# The value-format phase of scripts/bench.sh (sourced, not run): this tree's
# outboxd draining one backlog per transaction shape in each value format of
# BENCH_FORMATS (json, avro, json-schema), against a schema registry.
#
#   formats_registry_start     starts Apicurio (scripts/registry.sh) in
#                              $out/registry and registers the bench payload's
#                              Avro schema and JSON Schema; sets $formats_url
#   formats_registry_stop      stops it (safe to call twice)
#   formats_phase TXN REPS     one backlog of $events events in TXN-row
#                              transactions, then REPS rounds of one drain
#                              per format
#
# As in the A/B of builds (scripts/lib/ab.sh): every drain has its own slot,
# all created before the backlog is written, so each reads the same WAL from
# the same first event; the order of the formats rotates from round to round,
# so a host that speeds up or slows down shifts them alike. Each drain
# publishes to topics of its own. The registry answers from the same host:
# its requests are counted by outboxd (outboxd_schema_registry_requests_total,
# start-up included) and read from /metrics at the drain's end.

formats_url=
formats_registry_dir=

# The bench payload (scripts/lib/workload.sh) field by field: "t" the
# writer's clock in microseconds, the rest strings ("amount" is '100.50').
formats_avro_schema='{"type":"record","name":"OrderCreated","namespace":"bench","fields":[
  {"name":"t","type":"long"},{"name":"orderId","type":"string"},{"name":"amount","type":"string"},
  {"name":"currency","type":"string"},{"name":"customer","type":"string"},{"name":"note","type":"string"}]}'
# shellcheck disable=SC2016 # "$schema" is the JSON Schema keyword, not a variable
formats_json_schema='{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
  "properties":{"t":{"type":"integer"},"orderId":{"type":"string","pattern":"^[0-9]{10}$"},
  "amount":{"type":"string"},"currency":{"type":"string","enum":["RUB","EUR","USD"]},
  "customer":{"type":"string"},"note":{"type":"string"}},
  "required":["t","orderId","amount","currency","customer","note"],"additionalProperties":false}'

# The subject each registry format's drains use (one for all their topics).
formats_subject() { echo "bench-$1-value"; }

formats_register() { # subject schema_type schema
  local body answer
  body=$(python3 -c 'import json, sys
b = {"schema": json.dumps(json.loads(sys.argv[2]))}
if sys.argv[1] != "AVRO": b["schemaType"] = sys.argv[1]
print(json.dumps(b))' "$2" "$3")
  answer=$(curl -sS --max-time 10 -X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
    --data-binary "$body" "$formats_url/subjects/$1/versions") ||
    { echo "registering $1 failed" >&2; exit 1; }
  [[ $answer == *'"id"'* ]] || { echo "registering $1: $answer" >&2; exit 1; }
  log "registered $1: $answer"
}

formats_registry_start() {
  formats_registry_dir=$out/registry
  mkdir -p "$formats_registry_dir"
  log "starting the schema registry (scripts/registry.sh)"
  formats_url=$(REGISTRY_PARENT_PID=$$ "$root/scripts/registry.sh" start "$formats_registry_dir" |
    tail -n1)
  [[ $formats_url == http://127.0.0.1:* ]] || { echo "the registry did not start" >&2; exit 1; }
  formats_register "$(formats_subject avro)" AVRO "$formats_avro_schema"
  formats_register "$(formats_subject json-schema)" JSON "$formats_json_schema"
}

formats_registry_stop() {
  [[ -n $formats_registry_dir ]] || return 0
  "$root/scripts/registry.sh" stop "$formats_registry_dir" >/dev/null 2>&1 || true
  formats_registry_dir=
}

# One drain of slot SLOT in FORMAT into topic prefix RUN; records RUN's figures.
formats_drain() { # db slot run count format
  local db=$1 slot=$2 run=$3 count=$4 format=$5 dir=$out/formats
  local port
  port=$(servers_free_port)
  {
    outboxd_toml "$db" "$slot"
    cat <<CONF
[routing]
topic = "$run.\${aggregate_type}"
value_format = "$format"
CONF
    [[ $format == json ]] || echo "subject = \"$(formats_subject "$format")\""
    cat <<CONF
[metrics]
listen = "127.0.0.1:$port"
[schema_registry]
url = "$formats_url"
CONF
  } >"$dir/$run.toml"
  # The consumer times nothing from the payload: an Avro value is not JSON.
  start_consumer formats "$run" "$count" "$run.fmt" -
  local started
  started=$(now_ms)
  "$bin/outboxd" run --config "$dir/$run.toml" 2>>"$dir/$run.relay.log" &
  relay_pid=$!
  put "$run.start_ms" "$started"
  sleep 0.3
  kill -0 "$relay_pid" 2>/dev/null || { tail -n 30 "$dir/$run.relay.log" >&2; echo "$run: outboxd exited at startup" >&2; exit 1; }
  wait_consumer formats "$run"
  put "$run.cpu_ticks" "$(ticks "$relay_pid")"
  put "$run.peak_rss_kib" "$(peak_rss_kib "$relay_pid")"
  put "$run.registry_requests" "$(curl -s "http://127.0.0.1:$port/metrics" |
    awk '/^outboxd_schema_registry_requests_total/ { n += $2 } END { print n + 0 }')"
  stop_relay "$run" "$dir/$run.relay.log"
}

formats_phase() { # txn reps
  local txn=$1 reps=$2 db=bench_fmt_$1 i f
  local -a fmts
  read -r -a fmts <<<"$formats"
  mkdir -p "$out/formats"
  log "formats, $txn-row transactions: $reps rounds of ${fmts[*]} on one backlog"
  servers_psql postgres -c "CREATE DATABASE $db"
  servers_psql "$db" -f migrations/001_outbox.sql -f migrations/002_outbox_emit.sql \
    -f migrations/003_publication.sql >/dev/null
  for i in $(seq 1 "$reps"); do
    for f in "${fmts[@]}"; do
      servers_psql "$db" -c "SELECT pg_create_logical_replication_slot('fmt_${f//-/_}_$i', 'pgoutput')" >/dev/null
    done
  done
  servers_psql "$db" -c CHECKPOINT
  # aggregate_type "fmt": each drain's topic is "<run>.fmt".
  write_events formats "$db" fmt "$txn" "$events" 0
  local count=$REPLY
  put "fmt.$txn.events" "$count"
  put "fmt.$txn.reps" "$reps"
  servers_psql "$db" -c CHECKPOINT
  for i in $(seq 1 "$reps"); do
    local k n=${#fmts[@]}
    for k in $(seq 0 $((n - 1))); do
      f=${fmts[$(((k + i - 1) % n))]}
      formats_drain "$db" "fmt_${f//-/_}_$i" "fmt-$txn-$f-$i" "$count" "$f"
    done
    log "formats $txn-row round $i: $(python3 "$root/scripts/lib/formats_report.py" round "$out" "$tck" "$txn" "$i" "$formats")"
  done
  servers_psql "$db" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
    WHERE database = '$db'" >/dev/null
  servers_psql postgres -c "DROP DATABASE $db"
}
