# shellcheck shell=bash disable=SC2034 # the variables set here are for the sourcing script
# Private servers on loopback for scripts/bench.sh (sourced, not run): a
# PostgreSQL cluster with wal_level=logical and a single-node Kafka broker,
# both under one directory and stopped by servers_stop. As root, PostgreSQL
# runs as the unprivileged `outboxd-test` user (scripts/postgres.sh
# ensure-user creates it), like scripts/demo.sh and the tests.
#
#   servers_pg_start DIR VERSION [CONF_LINE...]
#       initdb DIR/pg, start it on a free port; sets PG_PORT, PG_URL_BASE
#       (postgresql://postgres@127.0.0.1:PORT, no database), PG_DATA, PG_BIN,
#       PG_POSTMASTER_PID. Extra postgresql.conf lines may be given.
#   servers_kafka_start DIR     start a broker in DIR/kafka; sets KAFKA_BROKERS, KAFKA_PID
#   servers_kafka_begin DIR     the same in the background (the caller starts
#                               PostgreSQL meanwhile); servers_kafka_wait ends it
#   servers_stop                stop whatever of the two was started (safe to call twice)
#   servers_psql DB ARGS...     psql -X -q -v ON_ERROR_STOP=1 against database DB

servers_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
servers_as_pg=()
servers_pg_started=
servers_kafka_dir=

servers_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

servers_pg_start() {
  local dir=$1 version=$2
  shift 2
  mkdir -p "$dir"
  chmod 755 "$dir"
  if [[ $(id -u) == 0 ]]; then
    "$servers_repo/scripts/postgres.sh" ensure-user >/dev/null
    servers_as_pg=(runuser -u outboxd-test --)
    chown outboxd-test "$dir"
  fi
  local env_lines
  env_lines=$("$servers_repo/scripts/postgres.sh" env "$version")
  PG_BIN=$(sed -n 's/^PG_BIN=//p' <<<"$env_lines")
  local lib
  lib=$(sed -n 's/^PG_LIB=//p' <<<"$env_lines")
  if [[ -n $lib ]]; then servers_as_pg=("${servers_as_pg[@]}" env "LD_LIBRARY_PATH=$lib"); fi
  PG_DATA=$dir/pg
  PG_PORT=$(servers_free_port)
  "${servers_as_pg[@]}" "$PG_BIN/initdb" -D "$PG_DATA" -U postgres -A trust -E UTF8 >/dev/null
  {
    echo "wal_level = logical"
    echo "listen_addresses = '127.0.0.1'"
    echo "port = $PG_PORT"
    echo "unix_socket_directories = '$dir'"
    local line
    for line in "$@"; do echo "$line"; done
  } >>"$PG_DATA/postgresql.conf"
  "${servers_as_pg[@]}" "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$dir/pg.log" -w start >/dev/null
  servers_pg_started=1
  PG_URL_BASE="postgresql://postgres@127.0.0.1:$PG_PORT"
  PG_POSTMASTER_PID=$(head -n1 "$PG_DATA/postmaster.pid")
}

servers_kafka_start() {
  servers_kafka_dir=$1/kafka
  mkdir -p "$servers_kafka_dir"
  # The watchdog stops the broker should this shell die without running its trap.
  KAFKA_BROKERS=$(KAFKA_PARENT_PID=$$ "$servers_repo/scripts/kafka.sh" start "$servers_kafka_dir")
  KAFKA_PID=$(tr -dc '0-9' <"$servers_kafka_dir/kafka.pid")
}

servers_kafka_begin_pid=
servers_kafka_begin() {
  servers_kafka_dir=$1/kafka
  mkdir -p "$servers_kafka_dir"
  KAFKA_PARENT_PID=$$ "$servers_repo/scripts/kafka.sh" start "$servers_kafka_dir" >"$servers_kafka_dir/brokers" &
  servers_kafka_begin_pid=$!
}

servers_kafka_wait() {
  wait "$servers_kafka_begin_pid" || { echo "scripts/kafka.sh start failed" >&2; return 1; }
  KAFKA_BROKERS=$(<"$servers_kafka_dir/brokers")
  KAFKA_PID=$(tr -dc '0-9' <"$servers_kafka_dir/kafka.pid")
}

servers_stop() {
  if [[ -n $servers_kafka_dir ]]; then
    "$servers_repo/scripts/kafka.sh" stop "$servers_kafka_dir" >/dev/null 2>&1 || true
    servers_kafka_dir=
  fi
  if [[ -n $servers_pg_started ]]; then
    "${servers_as_pg[@]}" "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast stop >/dev/null 2>&1 || true
    servers_pg_started=
  fi
}

servers_psql() {
  local db=$1
  shift
  psql -X -q -v ON_ERROR_STOP=1 "$PG_URL_BASE/$db" "$@"
}
