#!/usr/bin/env bash
# Single-node Apache Kafka (KRaft, broker+controller in one JVM) for tests and the demo.
#
#   scripts/kafka.sh fetch              download the broker jars (cached) and print their dir
#   scripts/kafka.sh tools              download the command-line tools' jars (cached) and
#                                       print the classpath to run them with
#   scripts/kafka.sh start DIR [PORT]   configure/format DIR, start the broker, wait until it
#                                       is ready, print 127.0.0.1:PORT on stdout
#   scripts/kafka.sh stop DIR           SIGTERM (20 s grace), then SIGKILL
#   scripts/kafka.sh cluster-start DIR  a 3-node cluster (combined broker+controller nodes in
#                                       DIR/node-1..3), print the bootstrap list
#   scripts/kafka.sh start DIR/node-N   start one node of a cluster again (same address)
#   scripts/kafka.sh cut DIR/node-N     drop every packet to and from that node (heal undoes)
#   scripts/kafka.sh heal DIR/node-N
#   scripts/kafka.sh cluster-stop DIR   stop every node, remove the cluster's network
#
# The cluster: replication factor 3 and min.insync.replicas 2 for every topic (the internal
# ones too), the brokers' default session timeout (9 s). Run as root, each node gets its own
# network namespace on a private bridge (10.231.X.0/24; the host is .254), so that `cut`
# black-holes it from the clients and the other nodes alike, as a dead switch would; without
# root (or with KAFKA_CLUSTER_NETNS=0) the nodes listen on loopback ports and `cut` refuses.
#
# Environment:
#   OUTBOXD_CACHE     cache root (default <repo>/.cache); jars go to $OUTBOXD_CACHE/kafka/<ver>/libs
#   KAFKA_VERSION     org.apache.kafka:kafka_2.13 version (default below)
#   KAFKA_PARENT_PID  if set, a watchdog stops the broker when that process exits
#   KAFKA_WATCHDOG_RMDIR=1  ... and then deletes DIR (for temporary dirs nobody else cleans)
#   KAFKA_HEAP        JVM heap options (default "-Xms128m -Xmx512m")
#   KAFKA_EXTRA_PROPERTIES  lines appended to server.properties (later lines win), e.g. an
#                     authorizer or transaction.state.log.replication.factor=3 for a test;
#                     in a single broker's, @PORT@ and @CPORT@ become its PLAINTEXT and
#                     controller ports (for a listeners= line with further listeners)
#   KAFKA_START_TIMEOUT  seconds to wait for readiness (default 60)
#   KAFKA_SEPARATE_CONTROLLER=1  at a single broker's first start: its controller in a JVM of
#                     its own (DIR/controller), which a kill of the broker leaves running, as
#                     production's controllers are; `start DIR` again starts only the broker,
#                     `stop DIR` stops both
#   JAVA              java binary (default: $JAVA_HOME/bin/java, else java on PATH)
#
# Everything listens on 127.0.0.1 only. Progress goes to stderr; stdout carries only the
# result (the libs dir for fetch, host:port for start).
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
# log4j2 binding for slf4j 1.7 (the slf4j-api version Kafka 4.x depends on); keep it at the
# log4j-core version Kafka's pom pulls in.
LOG4J_VERSION="${KAFKA_LOG4J_VERSION:-2.25.5}"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"
CACHE_ROOT="${OUTBOXD_CACHE:-$REPO_DIR/.cache}"
KAFKA_HOME="$CACHE_ROOT/kafka/$KAFKA_VERSION"
LIBS_DIR="$KAFKA_HOME/libs"
TOOLS_DIR="$KAFKA_HOME/tools"

if [[ -n "${JAVA:-}" ]]; then
  :
elif [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
  JAVA="$JAVA_HOME/bin/java"
else
  JAVA="java"
fi

log() { echo "kafka.sh: $*" >&2; }
die() { echo "kafka.sh: error: $*" >&2; exit 1; }

usage() {
  sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---------------------------------------------------------------- fetch

fetch() {
  maven_copy "$LIBS_DIR" "kafka_2.13-$KAFKA_VERSION.jar" "$(cat <<EOF
    <!-- broker core: kafka.Kafka, kafka.tools.StorageTool, KafkaRaftServer -->
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <!-- slf4j 1.7 -> log4j2 binding (log4j-api/-core come with kafka_2.13) -->
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>$LOG4J_VERSION</version>
    </dependency>
EOF
)"
}

# The command-line tools (kafka-transactions.sh's TransactionsCommand): the
# classpath to run them with, the broker's jars first.
tools() {
  local libs
  libs="$(fetch)"
  maven_copy "$TOOLS_DIR" "kafka-tools-$KAFKA_VERSION.jar" "$(cat <<EOF
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
EOF
)" >/dev/null
  echo "$libs/*:$TOOLS_DIR/*"
}

# maven_copy DIR JAR DEPENDENCIES: the runtime classpath of DEPENDENCIES (pom
# <dependency> elements) copied into DIR once, JAR among them; prints DIR.
maven_copy() {
  local dir="$1" jar="$2" deps="$3"
  if [[ -f "$dir/.complete" ]]; then
    echo "$dir"
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found (apt-get install maven)"
  mkdir -p "$KAFKA_HOME"
  local name
  name="$(basename "$dir")"
  # Concurrent first starts (parallel tests) fetch once.
  local lockfd
  exec {lockfd}>"$KAFKA_HOME/.fetch-$name.lock"
  flock "$lockfd"
  if [[ -f "$dir/.complete" ]]; then
    exec {lockfd}>&-
    echo "$dir"
    return 0
  fi
  local tmp="$dir.tmp.$$"
  rm -rf "$tmp"
  cat >"$KAFKA_HOME/pom-$name.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by scripts/kafka.sh: runtime classpath ($name) of Kafka $KAFKA_VERSION -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.outboxd</groupId>
  <artifactId>kafka-$name-runtime</artifactId>
  <version>$KAFKA_VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
$deps
  </dependencies>
</project>
EOF
  log "fetching $jar and what it needs with mvn ..."
  # (Maven 3.8 -q still prints bare ANSI resets: strip them.)
  if ! (cd "$KAFKA_HOME" && mvn -q -B -Dstyle.color=never -f "pom-$name.xml" \
          dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" </dev/null 2>&1 |
          sed 's/\x1b\[[0-9;]*m//g' >&2); then
    rm -rf "$tmp"
    die "mvn could not fetch $jar"
  fi
  [[ -f "$tmp/$jar" ]] || { rm -rf "$tmp"; die "$jar missing after mvn"; }
  touch "$tmp/.complete"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  exec {lockfd}>&-
  log "cached in $dir ($(du -sh "$dir" | cut -f1))"
  echo "$dir"
}

# ---------------------------------------------------------------- helpers

# shellcheck source=lib/procs.sh
source "$SCRIPT_DIR/lib/procs.sh"

prop() { # file key -> value or empty
  [[ -f "$1" ]] || return 0
  sed -n "s/^$2=//p" "$1" | tail -n1
}

random_cluster_id() { # 16 random bytes, base64url without padding = 22 chars (a Kafka Uuid)
  # The id is passed as --cluster-id=ID: a base64url id may start with '-',
  # which the storage tool's argument parser would take for an option.
  head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n'
}

jvm_opts() {
  # Serial GC + C1-only JIT: measured to start the broker fastest on the 2-core test
  # machines, and plenty for test traffic. KAFKA_JVM_OPTS replaces these.
  echo "${KAFKA_JVM_OPTS:--XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true}"
}

# Class-data sharing: the first broker that stops cleanly leaves a dynamic CDS archive of
# the classes it loaded (-XX:ArchiveClassesAtExit); later JVMs map it (-XX:SharedArchiveFile),
# which roughly halves broker start time. One archive per java binary (path and mtime, so a
# JDK upgrade makes a new one); KAFKA_CDS=0 disables.
cds_archive() {
  local j
  j="$(readlink -f "$(command -v "$JAVA")" 2>/dev/null || echo "$JAVA")"
  echo "$KAFKA_HOME/cds-$(echo "$j:$(stat -c %Y "$j" 2>/dev/null)" | cksum | cut -d' ' -f1).jsa"
}

cds_opts() { # dir -> JVM options; records a pending archive in dir/cds.pending
  [[ "${KAFKA_CDS:-1}" != 0 ]] || return 0
  local jsa
  jsa="$(cds_archive)"
  if [[ -s "$jsa" ]]; then
    echo "-XX:SharedArchiveFile=$jsa -Xlog:cds=off -Xlog:cds+dynamic=off"
  elif [[ -n "${1:-}" && "${KAFKA_CDS_RECORD:-1}" == 1 ]]; then
    local tmp="$jsa.tmp.$$"
    echo "$tmp" >"$1/cds.pending"
    echo "-XX:ArchiveClassesAtExit=$tmp -Xlog:cds=off -Xlog:cds+dynamic=off"
  fi
}

cds_promote() { # dir clean(0/1): after the JVM has exited, keep its archive if it exited cleanly
  local dir="$1" clean="$2" tmp
  [[ -f "$dir/cds.pending" ]] || return 0
  tmp="$(cat "$dir/cds.pending")"
  rm -f "$dir/cds.pending"
  if [[ "$clean" == 1 && -s "$tmp" ]]; then
    mv -f "$tmp" "$(cds_archive)" 2>/dev/null || rm -f "$tmp"
  else
    rm -f "$tmp"
  fi
}

write_log4j() { # dir
  cat >"$1/log4j2.properties" <<'EOF'
# generated by scripts/kafka.sh
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.controller.name = org.apache.kafka.controller
logger.controller.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.appinfo.name = org.apache.kafka.common.utils.AppInfoParser
logger.appinfo.level = WARN
EOF
}

write_properties() { # dir port cport
  local dir="$1" port="$2" cport="$3"
  cat >"$dir/server.properties" <<EOF
# generated by scripts/kafka.sh: single-node KRaft broker+controller for tests
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# After a crash (kill -9) the restarted broker cannot register until the controller has
# fenced its previous incarnation, i.e. until the session times out (default 9 s).
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
log.cleaner.threads=1
EOF
  if [[ -n "${KAFKA_EXTRA_PROPERTIES:-}" ]]; then
    # @PORT@ and @CPORT@ stand for the two ports picked here, so that extra listeners can
    # be declared beside them.
    local extra="${KAFKA_EXTRA_PROPERTIES//@PORT@/$port}"
    printf '# KAFKA_EXTRA_PROPERTIES\n%s\n' "${extra//@CPORT@/$cport}" >>"$dir/server.properties"
  fi
}

# write_separate_properties DIR PORT CPORT ROLE: a single broker (node 1) and its controller
# (node 2) in JVMs of their own: write_properties' settings with ROLE's roles, id and listeners.
write_separate_properties() {
  local dir="$1" port="$2" cport="$3" role="$4"
  write_properties "$dir" "$port" "$cport"
  local -a edit=(-e "s/^controller.quorum.voters=.*/controller.quorum.voters=2@127.0.0.1:$cport/")
  if [[ $role == broker ]]; then
    edit+=(-e "s/^process.roles=.*/process.roles=broker/"
      -e "s|^listeners=.*|listeners=PLAINTEXT://127.0.0.1:$port|")
  else
    edit+=(-e "s/^process.roles=.*/process.roles=controller/" -e "s/^node.id=.*/node.id=2/"
      -e "s|^listeners=.*|listeners=CONTROLLER://127.0.0.1:$cport|"
      -e "/^advertised.listeners=/d" -e "/^inter.broker.listener.name=/d")
  fi
  sed -i "${edit[@]}" -e "1s|.*|# generated by scripts/kafka.sh: the $role of a single broker, its controller apart|" \
    "$dir/server.properties"
}

# A node of a cluster (node.env in its dir: NODE_ID HOST PORT CPORT VOTERS NETNS). The
# brokers' session and heartbeat stay at Kafka's defaults: what production runs with.
write_cluster_properties() { # dir
  local dir="$1"
  cat >"$dir/server.properties" <<EOF
# generated by scripts/kafka.sh: node $NODE_ID of a 3-node KRaft cluster for tests
process.roles=broker,controller
node.id=$NODE_ID
controller.quorum.voters=$VOTERS
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CPORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
auto.create.topics.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
# The one setting changed from Kafka's defaults, as docs/operations.md advises ("The active
# controller cut off"): a broker's requests to the controller (producer-id blocks among
# them) give up on one that stopped answering after 5 s instead of 30 s, and go to the
# controller the quorum elected meanwhile.
controller.socket.timeout.ms=5000
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
num.recovery.threads.per.data.dir=1
background.threads=2
log.cleaner.threads=1
EOF
  if [[ -n "${KAFKA_EXTRA_PROPERTIES:-}" ]]; then
    printf '# KAFKA_EXTRA_PROPERTIES\n%s\n' "$KAFKA_EXTRA_PROPERTIES" >>"$dir/server.properties"
  fi
}

# ---------------------------------------------------------------- start

start() {
  [[ $# -ge 1 && $# -le 2 ]] || usage
  local dir port cport
  mkdir -p "$1"
  dir="$(cd "$1" && pwd)"
  port="${2:-}"

  local pid
  pid="$(read_pid "$dir/kafka.pid")"
  if alive "$pid"; then
    die "a broker is already running from $dir (pid $pid); run: $0 stop $dir"
  fi

  fetch >/dev/null

  if [[ -f "$dir/node.env" ]]; then
    start_node "$dir"
    return
  fi

  # Same DIR again (restart): keep the controller port and the formatted data.
  cport="$(prop "$dir/server.properties" controller.quorum.voters | sed -n 's/.*:\([0-9]*\)$/\1/p')"
  if [[ -z "$port" ]]; then
    port="$(prop "$dir/server.properties" advertised.listeners | sed -n 's/.*:\([0-9]*\)$/\1/p')"
    [[ -n "$port" ]] || port="$(free_port)"
  fi
  [[ "$port" =~ ^[0-9]+$ ]] || die "bad port: $port"
  if [[ -z "$cport" || "$cport" == "$port" ]]; then
    cport="$(free_port)"
    while [[ "$cport" == "$port" ]]; do cport="$(free_port)"; done
  fi
  local separate=0
  [[ "${KAFKA_SEPARATE_CONTROLLER:-0}" != 1 && ! -d "$dir/controller" ]] || separate=1
  # A broker that was just killed may hold its ports for a moment longer: wait up to 10 s.
  # (A controller of its own keeps running through the broker's restarts.)
  local _ cport_busy=(port_in_use "$cport")
  if [[ $separate == 1 ]] && alive "$(read_pid "$dir/controller/kafka.pid")"; then
    cport_busy=(false)
  fi
  for _ in $(seq 1 50); do
    port_in_use "$port" || "${cport_busy[@]}" || break
    sleep 0.2
  done
  if port_in_use "$port"; then die "port $port is already in use"; fi
  if "${cport_busy[@]}"; then die "controller port $cport is already in use"; fi

  if [[ $separate == 1 ]]; then
    start_controller "$dir/controller" "$cport"
    write_separate_properties "$dir" "$port" "$cport" broker
    CLUSTER_ID="$(cat "$dir/controller/cluster.id")" run_broker "$dir" 127.0.0.1 "$port" "$cport" ""
    return
  fi
  write_properties "$dir" "$port" "$cport"
  run_broker "$dir" 127.0.0.1 "$port" "$cport" ""
}

# start_controller CDIR CPORT: the controller of a single broker in CDIR (its cluster id in
# CDIR/cluster.id), unless it is running; a broker's restart leaves it as it is.
start_controller() {
  local cdir="$1" cport="$2"
  mkdir -p "$cdir"
  alive "$(read_pid "$cdir/kafka.pid")" && return 0
  [[ -s "$cdir/cluster.id" ]] || random_cluster_id >"$cdir/cluster.id"
  write_separate_properties "$cdir" "" "$cport" controller
  # A controller loads fewer classes than a broker: its archive would not serve brokers.
  # Not `run_broker ... >/dev/null`: bash would keep this script's stdout open on a spare
  # descriptor while the function runs, and the watchdog it forks would hold it for good, so
  # a caller reading the script's output to its end would wait as long.
  CLUSTER_ID="$(cat "$cdir/cluster.id")" KAFKA_WATCHDOG_RMDIR=0 KAFKA_CDS_RECORD=0 \
    KAFKA_PRINT_ADDRESS=0 run_broker "$cdir" 127.0.0.1 "$cport" "$cport" ""
}

# run_broker DIR HOST PORT CPORT NETNS: format DIR once (the cluster id from $CLUSTER_ID, else a
# random one), start the JVM (in network namespace NETNS if given), wait until it is ready,
# print HOST:PORT.
run_broker() {
  local dir="$1" host="$2" port="$3" cport="$4" netns="$5"
  local -a in_ns=()
  [[ -z "$netns" ]] || in_ns=(ip netns exec "$netns")
  local pid
  write_log4j "$dir"
  mkdir -p "$dir/data" "$dir/logs"

  local cp="$LIBS_DIR/*"
  local -a common=(-Dlog4j2.configurationFile="$dir/log4j2.properties" -Dkafka.logs.dir="$dir/logs")
  # shellcheck disable=SC2207
  local -a opts=($(jvm_opts))

  if [[ ! -f "$dir/data/meta.properties" ]]; then
    local cid="${CLUSTER_ID:-}"
    [[ -n "$cid" ]] || cid="$(random_cluster_id)"
    # shellcheck disable=SC2046
    if ! "$JAVA" -Xmx256m "${opts[@]}" $(cds_opts) "${common[@]}" -cp "$cp" kafka.tools.StorageTool \
          format "--cluster-id=$cid" -c "$dir/server.properties" >"$dir/format.log" 2>&1; then
      cat "$dir/format.log" >&2
      die "kafka-storage format failed"
    fi
  fi

  # Only look at log lines written by this start.
  touch "$dir/kafka.log"
  local offset
  offset=$(( $(wc -c <"$dir/kafka.log") + 1 ))
  echo "==== start $(date '+%F %T') port=$port controller=$cport ====" >>"$dir/kafka.log"

  cds_promote "$dir" 0 # leftover of a broker that was killed
  local cds
  cds="$(cds_opts "$dir")"
  # In DIR, so that anything the JVM drops in its working dir (hs_err_pid*.log) lands there.
  # shellcheck disable=SC2086
  (cd "$dir" && exec "${in_ns[@]}" "$JAVA" ${KAFKA_HEAP:--Xms128m -Xmx512m} "${opts[@]}" $cds "${common[@]}" \
    -cp "$cp" kafka.Kafka "$dir/server.properties") </dev/null >>"$dir/kafka.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/kafka.pid"

  if [[ -n "${KAFKA_PARENT_PID:-}" ]]; then
    start_watchdog "$KAFKA_PARENT_PID" "$pid" "$dir"
  fi

  local timeout="${KAFKA_START_TIMEOUT:-60}"
  local deadline=$(( SECONDS + timeout ))
  local t0=$SECONDS
  while :; do
    if ! alive "$pid"; then
      tail -n 60 "$dir/kafka.log" >&2
      die "broker exited during startup (log: $dir/kafka.log)"
    fi
    if tail -c +"$offset" "$dir/kafka.log" | grep -q 'Kafka Server started' && port_in_use "$port" "$host"; then
      break
    fi
    if (( SECONDS >= deadline )); then
      tail -n 60 "$dir/kafka.log" >&2
      kill -9 "$pid" 2>/dev/null || true
      die "broker not ready after ${timeout}s (log: $dir/kafka.log)"
    fi
    sleep 0.2
  done
  log "broker pid $pid ready on $host:$port after $(( SECONDS - t0 ))s (dir $dir)"
  [[ "${KAFKA_PRINT_ADDRESS:-1}" == 0 ]] || echo "$host:$port"
}

start_watchdog() { # parent_pid kafka_pid dir
  local parent="$1" kpid="$2" dir="$3"
  (
    trap '' HUP INT
    while alive "$parent" && alive "$kpid"; do
      sleep 1
    done
    # Parent still there: the broker was stopped or killed on purpose; stop/restart handle it.
    if alive "$parent"; then exit 0; fi
    clean=0 # keep a CDS archive only from a shutdown we saw complete
    if alive "$kpid"; then
      kill -TERM "$kpid" 2>/dev/null || true
      kill -CONT "$kpid" 2>/dev/null || true # a paused broker only sees TERM once resumed
      clean=0
      for _ in $(seq 1 40); do
        if ! alive "$kpid"; then
          clean=1
          break
        fi
        sleep 0.5
      done
      if [[ $clean == 0 ]]; then
        kill -KILL "$kpid" 2>/dev/null || true
        sleep 0.5
      fi
    fi
    cds_promote "$dir" "$clean"
    rm -f "$dir/kafka.pid" "$dir/watchdog.pid"
    if [[ "${KAFKA_WATCHDOG_RMDIR:-0}" == 1 ]]; then
      rm -rf "$dir"
    fi
  ) </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/watchdog.pid"
}

# ---------------------------------------------------------------- stop

stop() {
  [[ $# -eq 1 ]] || usage
  local dir="$1" pid wpid
  pid="$(read_pid "$dir/kafka.pid")"
  wpid="$(read_pid "$dir/watchdog.pid")"
  local clean=0
  if alive "$pid"; then
    clean=1
    kill -TERM "$pid" 2>/dev/null || true
    kill -CONT "$pid" 2>/dev/null || true
    local _
    for _ in $(seq 1 100); do
      alive "$pid" || break
      sleep 0.2
    done
    if alive "$pid"; then
      clean=0
      log "broker pid $pid did not stop within 20s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do
        alive "$pid" || break
        sleep 0.1
      done
    fi
  fi
  if alive "$wpid"; then kill "$wpid" 2>/dev/null || true; fi
  cds_promote "$dir" "$clean"
  rm -f "$dir/kafka.pid" "$dir/watchdog.pid"
  # A broker's controller of its own stops after it (a broker stopping talks to it).
  if [[ -d "$dir/controller" ]]; then stop "$dir/controller"; fi
}

# ---------------------------------------------------------------- cluster

# The node in DIR (its node.env), started again on the same address and data.
start_node() { # dir
  local dir="$1"
  # shellcheck disable=SC1091
  source "$dir/node.env"
  local _
  for _ in $(seq 1 50); do # a killed node may hold its ports for a moment
    port_in_use "$PORT" "$HOST" || port_in_use "$CPORT" "$HOST" || break
    sleep 0.2
  done
  if port_in_use "$PORT" "$HOST"; then die "port $HOST:$PORT is already in use"; fi
  write_cluster_properties "$dir"
  run_broker "$dir" "$HOST" "$PORT" "$CPORT" "$NETNS"
}

netns_wanted() {
  case "${KAFKA_CLUSTER_NETNS:-auto}" in
    0) return 1 ;;
    1) return 0 ;;
    *) [[ $EUID == 0 ]] && command -v ip >/dev/null 2>&1 && command -v iptables >/dev/null 2>&1 ;;
  esac
}

# net_up DIR N: a bridge obkX with 10.231.X.254/24 and, per node i, a network namespace obkX-i
# whose eth0 (a veth on the bridge) is 10.231.X.i. X is the first number no other cluster on
# this machine uses (several test binaries may run at once). Writes DIR/net.env.
net_up() {
  local dir="$1" n="$2" x lockfd
  exec {lockfd}>"/tmp/outboxd-kafka-net.lock"
  flock "$lockfd"
  for x in $(seq 1 250); do
    ip link show "obk$x" >/dev/null 2>&1 && continue
    ip -o link show | grep -q ": obk${x}v" && continue
    ip -o addr show | grep -q " 10\.231\.$x\." && continue
    break
  done
  local br="obk$x"
  ip link add "$br" type bridge
  echo "BRIDGE=$br" >"$dir/net.env"
  ip addr add "10.231.$x.254/24" dev "$br"
  ip link set "$br" up
  local i
  for i in $(seq 1 "$n"); do
    ip netns add "$br-$i"
    echo "NETNS_$i=$br-$i" >>"$dir/net.env"
    ip link add "${br}v$i" type veth peer name "${br}p$i"
    echo "VETH_$i=${br}v$i" >>"$dir/net.env"
    ip link set "${br}p$i" netns "$br-$i"
    ip link set "${br}v$i" master "$br" up
    ip netns exec "$br-$i" ip link set "${br}p$i" name eth0
    ip netns exec "$br-$i" ip addr add "10.231.$x.$i/24" dev eth0
    ip netns exec "$br-$i" ip link set eth0 up
    ip netns exec "$br-$i" ip link set lo up
  done
  exec {lockfd}>&-
  echo "10.231.$x"
}

net_down() { # dir
  [[ -f "$1/net.env" ]] || return 0
  local line
  while IFS= read -r line; do
    case "$line" in
      NETNS_*=*) ip netns del "${line#*=}" 2>/dev/null || true ;;
      # Also gone with its namespace, but only once the kernel gets round to it.
      VETH_*=*) ip link del "${line#*=}" 2>/dev/null || true ;;
      BRIDGE=*) ip link del "${line#*=}" 2>/dev/null || true ;;
    esac
  done < <(tac "$1/net.env")
  rm -f "$1/net.env"
}

cluster_start() {
  [[ $# -eq 1 ]] || usage
  mkdir -p "$1"
  local dir n=3 i
  dir="$(cd "$1" && pwd)"
  [[ ! -f "$dir/node-1/node.env" ]] || die "$dir already holds a cluster"
  fetch >/dev/null
  local -a hosts=() ports=() cports=()
  if netns_wanted; then
    local net
    net="$(net_up "$dir" "$n")" || { net_down "$dir"; die "cannot set up the cluster's network"; }
    for i in $(seq 1 "$n"); do hosts+=("$net.$i"); ports+=(9092); cports+=(9093); done
  else
    for i in $(seq 1 "$n"); do hosts+=(127.0.0.1); ports+=("$(free_port)"); cports+=("$(free_port)"); done
  fi
  local voters="" cid
  for i in $(seq 1 "$n"); do voters+="${voters:+,}$i@${hosts[i-1]}:${cports[i-1]}"; done
  cid="$(random_cluster_id)"
  for i in $(seq 1 "$n"); do
    mkdir -p "$dir/node-$i"
    local ns=""
    [[ ! -f "$dir/net.env" ]] || ns="$(sed -n "s/^NETNS_$i=//p" "$dir/net.env")"
    cat >"$dir/node-$i/node.env" <<EOF
NODE_ID=$i
HOST=${hosts[i-1]}
PORT=${ports[i-1]}
CPORT=${cports[i-1]}
VOTERS=$voters
NETNS=$ns
CLUSTER_ID=$cid
EOF
  done
  if [[ -n "${KAFKA_PARENT_PID:-}" ]]; then
    cluster_watchdog "$KAFKA_PARENT_PID" "$dir"
  fi
  # Together: a node is ready only once a majority of the controllers is.
  # Three JVMs starting at once on a busy 2-core host take longer than one.
  local -a pids=()
  for i in $(seq 1 "$n"); do
    KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-120}" KAFKA_WATCHDOG_RMDIR=0 \
      start "$dir/node-$i" >"$dir/node-$i/address" &
    pids+=($!)
  done
  local failed=0
  for i in "${pids[@]}"; do wait "$i" || failed=1; done
  if [[ $failed == 1 ]]; then
    cluster_stop "$dir"
    die "the cluster did not start (logs: $dir/node-*/kafka.log)"
  fi
  local list=""
  for i in $(seq 1 "$n"); do list+="${list:+,}$(cat "$dir/node-$i/address")"; done
  echo "$list"
}

# When the test process exits: stop the nodes (their own watchdogs do too), then remove the
# network and, with KAFKA_WATCHDOG_RMDIR=1, the directory.
cluster_watchdog() { # parent_pid dir
  local parent="$1" dir="$2"
  (
    trap '' HUP INT
    while alive "$parent" && [[ -d "$dir" ]]; do sleep 1; done
    alive "$parent" && exit 0
    cluster_stop "$dir"
    if [[ "${KAFKA_WATCHDOG_RMDIR:-0}" == 1 ]]; then rm -rf "$dir"; fi
  ) </dev/null >/dev/null 2>&1 &
}

cluster_stop() {
  [[ $# -eq 1 ]] || usage
  local node pid
  local -a stopping=()
  for node in "$1"/node-*; do
    [[ -d "$node" ]] || continue
    stop "$node" &
    stopping+=($!)
  done
  # Only these: a bare `wait` would also wait for the cluster's watchdog,
  # which cluster_start forks and which lives as long as the test process
  # (a failed start would then never return).
  for pid in "${stopping[@]}"; do wait "$pid" || true; done
  net_down "$1"
}

# cut/heal DIR/node-N: iptables in the node's namespace drops everything on its eth0, in and
# out: connections stay open, nothing arrives, nothing is refused.
cut_node() {
  [[ $# -eq 1 ]] || usage
  local ns
  ns="$(sed -n 's/^NETNS=//p' "$1/node.env" 2>/dev/null)"
  [[ -n "$ns" ]] || die "$1 is not a node in its own network namespace (root needed)"
  ip netns exec "$ns" iptables -A INPUT -i eth0 -j DROP
  ip netns exec "$ns" iptables -A OUTPUT -o eth0 -j DROP
}

heal_node() {
  [[ $# -eq 1 ]] || usage
  local ns
  ns="$(sed -n 's/^NETNS=//p' "$1/node.env" 2>/dev/null)"
  [[ -n "$ns" ]] || die "$1 is not a node in its own network namespace"
  ip netns exec "$ns" iptables -F
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  fetch) fetch ;;
  tools) tools ;;
  start) start "$@" ;;
  stop) stop "$@" ;;
  cluster-start) cluster_start "$@" ;;
  cluster-stop) cluster_stop "$@" ;;
  cut) cut_node "$@" ;;
  heal) heal_node "$@" ;;
  *) usage ;;
esac
