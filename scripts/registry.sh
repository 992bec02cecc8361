#!/usr/bin/env bash
# Apicurio Registry (in-memory storage) for tests and the demo: a schema
# registry speaking Confluent's REST API under /apis/ccompat/v7.
#
#   scripts/registry.sh fetch              download and unpack the registry (cached); print its dir
#   scripts/registry.sh java               print the Java 21+ binary it runs on
#   scripts/registry.sh start DIR [PORT]   start it with DIR as working dir, wait until it is ready,
#                                          print http://127.0.0.1:PORT/apis/ccompat/v7 on stdout
#   scripts/registry.sh stop DIR           SIGTERM (20 s grace), then SIGKILL
#
# Environment:
#   OUTBOXD_CACHE      cache root (default <repo>/.cache); the registry goes to
#                      $OUTBOXD_CACHE/apicurio/<ver>
#   APICURIO_VERSION   io.apicurio:apicurio-registry-app version (default below)
#   REGISTRY_PARENT_PID  if set, a watchdog stops the registry when that process exits
#   REGISTRY_WATCHDOG_RMDIR=1  ... and then deletes DIR (for temporary dirs nobody else cleans)
#   REGISTRY_HEAP      JVM heap options (default "-Xms64m -Xmx256m")
#   REGISTRY_START_TIMEOUT  seconds to wait for readiness (default 90)
#   JAVA               java binary (default: the first Java 21+ of $JAVA_HOME, PATH, /usr/lib/jvm)
#
# Apicurio 3 needs Java 21 or newer (scripts/setup.sh installs one where Debian has it).
# Everything listens on 127.0.0.1 only. Progress goes to stderr; stdout carries only the
# result. Storage is in memory: a restart starts empty.
set -euo pipefail

APICURIO_VERSION="${APICURIO_VERSION:-3.3.3}"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"
CACHE_ROOT="${OUTBOXD_CACHE:-$REPO_DIR/.cache}"
HOME_DIR="$CACHE_ROOT/apicurio/$APICURIO_VERSION"
APP_DIR="$HOME_DIR/app"

log() { echo "registry.sh: $*" >&2; }
die() { echo "registry.sh: error: $*" >&2; exit 1; }

usage() {
  sed -n '4,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---------------------------------------------------------------- java

java_major() { # java binary -> major version, or nothing
  "$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1
}

find_java() {
  local candidates=() j m
  if [[ -n "${JAVA:-}" ]]; then
    echo "$JAVA"
    return 0
  fi
  [[ -n "${JAVA_HOME:-}" ]] && candidates+=("$JAVA_HOME/bin/java")
  command -v java >/dev/null 2>&1 && candidates+=("$(command -v java)")
  # Newest first: the directory names carry the version.
  for j in $(ls -d /usr/lib/jvm/*/bin/java 2>/dev/null | sort -rV); do candidates+=("$j"); done
  for j in "${candidates[@]}"; do
    [[ -x "$j" ]] || continue
    m="$(java_major "$j")"
    if [[ -n "$m" ]] && ((m >= 21)); then
      echo "$j"
      return 0
    fi
  done
  die "no Java 21 or newer found (Apicurio Registry $APICURIO_VERSION needs one); run scripts/setup.sh or set JAVA"
}

# ---------------------------------------------------------------- fetch

fetch() {
  if [[ -f "$APP_DIR/.complete" ]]; then
    echo "$APP_DIR"
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found (apt-get install maven)"
  mkdir -p "$HOME_DIR"
  # Concurrent first starts (parallel tests) fetch once.
  local lockfd
  exec {lockfd}>"$HOME_DIR/.fetch.lock"
  flock "$lockfd"
  if [[ -f "$APP_DIR/.complete" ]]; then
    exec {lockfd}>&-
    echo "$APP_DIR"
    return 0
  fi
  local tmp="$HOME_DIR/fetch.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp/unpacked"
  local artifact="io.apicurio:apicurio-registry-app:$APICURIO_VERSION:tar.gz:all"
  log "fetching $artifact with mvn (about 160 MB, once) ..."
  # (Maven 3.8 -q still prints bare ANSI resets: strip them.)
  if ! (cd "$HOME_DIR" && mvn -q -B -Dstyle.color=never dependency:copy -Dartifact="$artifact" \
          -DoutputDirectory="$tmp" </dev/null 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2); then
    rm -rf "$tmp"
    die "mvn could not fetch $artifact"
  fi
  local archive="$tmp/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz"
  [[ -f "$archive" ]] || { rm -rf "$tmp"; die "$archive missing after mvn"; }
  tar xzf "$archive" -C "$tmp/unpacked" || { rm -rf "$tmp"; die "cannot unpack $archive"; }
  [[ -f "$tmp/unpacked/quarkus-run.jar" ]] || { rm -rf "$tmp"; die "quarkus-run.jar missing in $archive"; }
  touch "$tmp/unpacked/.complete"
  rm -rf "$APP_DIR"
  mv "$tmp/unpacked" "$APP_DIR"
  rm -rf "$tmp"
  # The local Maven repository keeps a copy of the archive; the unpacked app is all we use.
  rm -rf "${HOME}/.m2/repository/io/apicurio/apicurio-registry-app/$APICURIO_VERSION"
  exec {lockfd}>&-
  log "cached in $APP_DIR ($(du -sh "$APP_DIR" | cut -f1))"
  echo "$APP_DIR"
}

# ---------------------------------------------------------------- helpers

# shellcheck source=lib/procs.sh
source "$SCRIPT_DIR/lib/procs.sh"

ready() { # management port -> 0 once the registry says it is ready
  curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$1/health/ready"
}

# ---------------------------------------------------------------- start

start() {
  [[ $# -ge 1 && $# -le 2 ]] || usage
  mkdir -p "$1"
  local dir port mport pid java
  dir="$(cd "$1" && pwd)"
  port="${2:-}"
  pid="$(read_pid "$dir/registry.pid")"
  if alive "$pid"; then
    die "a registry is already running from $dir (pid $pid); run: $0 stop $dir"
  fi
  command -v curl >/dev/null 2>&1 || die "curl not found (run scripts/setup.sh)"
  fetch >/dev/null
  java="$(find_java)"
  [[ -n "$port" ]] || port="$(free_port)"
  [[ "$port" =~ ^[0-9]+$ ]] || die "bad port: $port"
  mport="$(free_port)"
  while [[ "$mport" == "$port" ]]; do mport="$(free_port)"; done
  if port_in_use "$port"; then die "port $port is already in use"; fi

  touch "$dir/registry.log"
  echo "==== start $(date '+%F %T') port=$port management=$mport ====" >>"$dir/registry.log"
  # Serial GC + C1 only, as for the broker: the quickest start on 2 cores, plenty for tests.
  # In DIR, so that anything the JVM drops in its working dir (hs_err_pid*.log) lands there.
  # shellcheck disable=SC2086
  (cd "$dir" && exec "$java" ${REGISTRY_HEAP:--Xms64m -Xmx256m} -XX:+UseSerialGC \
    -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
    -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$mport" \
    -jar "$APP_DIR/quarkus-run.jar") </dev/null >>"$dir/registry.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/registry.pid"
  echo "$mport" >"$dir/management.port"

  if [[ -n "${REGISTRY_PARENT_PID:-}" ]]; then
    start_watchdog "$REGISTRY_PARENT_PID" "$pid" "$dir"
  fi

  local timeout="${REGISTRY_START_TIMEOUT:-90}"
  local deadline=$(( SECONDS + timeout ))
  local t0=$SECONDS
  until ready "$mport"; do
    if ! alive "$pid"; then
      tail -n 60 "$dir/registry.log" >&2
      die "registry exited during startup (log: $dir/registry.log)"
    fi
    if (( SECONDS >= deadline )); then
      tail -n 60 "$dir/registry.log" >&2
      kill -9 "$pid" 2>/dev/null || true
      die "registry not ready after ${timeout}s (log: $dir/registry.log)"
    fi
    sleep 0.2
  done
  log "registry pid $pid ready on 127.0.0.1:$port after $(( SECONDS - t0 ))s (dir $dir)"
  echo "http://127.0.0.1:$port/apis/ccompat/v7"
}

start_watchdog() { # parent_pid registry_pid dir
  local parent="$1" rpid="$2" dir="$3"
  (
    trap '' HUP INT
    while alive "$parent" && alive "$rpid"; do
      sleep 1
    done
    # Parent still there: the registry was stopped on purpose; stop handles it.
    if alive "$parent"; then exit 0; fi
    if alive "$rpid"; then
      kill -TERM "$rpid" 2>/dev/null || true
      kill -CONT "$rpid" 2>/dev/null || true
      for _ in $(seq 1 40); do
        alive "$rpid" || break
        sleep 0.5
      done
      kill -KILL "$rpid" 2>/dev/null || true
    fi
    rm -f "$dir/registry.pid" "$dir/watchdog.pid"
    if [[ "${REGISTRY_WATCHDOG_RMDIR:-0}" == 1 ]]; then
      rm -rf "$dir"
    fi
  ) </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/watchdog.pid"
}

# ---------------------------------------------------------------- stop

stop() {
  [[ $# -eq 1 ]] || usage
  local dir="$1" pid wpid
  pid="$(read_pid "$dir/registry.pid")"
  wpid="$(read_pid "$dir/watchdog.pid")"
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    kill -CONT "$pid" 2>/dev/null || true
    local _
    for _ in $(seq 1 100); do
      alive "$pid" || break
      sleep 0.2
    done
    if alive "$pid"; then
      log "registry pid $pid did not stop within 20s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  if alive "$wpid"; then kill "$wpid" 2>/dev/null || true; fi
  rm -f "$dir/registry.pid" "$dir/watchdog.pid"
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  fetch) fetch ;;
  java) find_java ;;
  start) start "$@" ;;
  stop) stop "$@" ;;
  *) usage ;;
esac
