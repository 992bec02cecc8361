#!/usr/bin/env bash
# A transaction marker skipped for a partition without a leader: Kafka 4.4's
# coordinator treats such a partition as deleted (apache/kafka KAFKA-20734),
# and the transaction stays open there for good, holding back every
# read_committed reader of that partition. This is what stalled outboxd's
# exactly-once broker-fault tests behind the ledger topic (docs/guarantees.md).
#
# Two KRaft nodes on 127.0.0.1: node 1 controller+broker (the transaction
# coordinator), node 2 broker only, holding topic t (one partition, RF 1).
# A Java producer sends one record to t in a transaction; node 2 is
# SIGSTOPped for PAUSE seconds before the commit and resumed 2 s after it.
#
# Usage: scripts/repro/kafka-20734.sh [PAUSE]
#   PAUSE 8 (default): node 2 is fenced (session 3 s), t has no leader at
#     the commit: the commit succeeds, the coordinator logs "Couldn't find
#     leader endpoint for partitions Set(t-0) ... likely deleted already and
#     hence can be skipped", and read_committed sees 0 records, for good.
#   PAUSE 1: not fenced: read_committed sees the record.
set -euo pipefail
PAUSE="${1:-8}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIBS="$("$HERE/../kafka.sh" fetch)"
CP="$LIBS/*"
D="$(mktemp -d /tmp/kafka-20734.XXXX)"
P1=$((20000 + RANDOM % 5000)); P2=$((P1 + 1)); C=$((P1 + 2))
N1=""; N2=""
cleanup() { kill "$N1" "$N2" 2>/dev/null || true; kill -CONT "$N2" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT

common() {
  cat <<P
controller.quorum.voters=1@127.0.0.1:$C
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
P
}
mkdir -p "$D/n1" "$D/n2"
printf '%s\n' 'status = warn' 'appender.out.type = Console' 'appender.out.name = STDOUT' \
  'appender.out.layout.type = PatternLayout' 'appender.out.layout.pattern = [%d] %p %m (%c)%n' \
  'rootLogger.level = INFO' 'rootLogger.appenderRef.out.ref = STDOUT' >"$D/log4j2.properties"
sed 's/rootLogger.level = INFO/rootLogger.level = ERROR/' "$D/log4j2.properties" >"$D/client-log4j2.properties"
{
  echo "process.roles=broker,controller"; echo "node.id=1"
  echo "listeners=PLAINTEXT://127.0.0.1:$P1,CONTROLLER://127.0.0.1:$C"
  echo "advertised.listeners=PLAINTEXT://127.0.0.1:$P1"; echo "log.dirs=$D/n1/data"; common
} >"$D/n1/server.properties"
{
  echo "process.roles=broker"; echo "node.id=2"
  echo "listeners=PLAINTEXT://127.0.0.1:$P2"
  echo "advertised.listeners=PLAINTEXT://127.0.0.1:$P2"; echo "log.dirs=$D/n2/data"; common
} >"$D/n2/server.properties"
CID="$(java -cp "$CP" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
for n in n1 n2; do
  java -cp "$CP" kafka.tools.StorageTool format "--cluster-id=$CID" -c "$D/$n/server.properties" >/dev/null 2>&1
done
start() {
  (cd "$D/$1" && exec java -Xmx256m "-Dlog4j2.configurationFile=$D/log4j2.properties" -cp "$CP" \
    kafka.Kafka "$D/$1/server.properties" >"$D/$1/kafka.log" 2>&1) &
  echo $!
}
wait_port() {
  for _ in $(seq 1 120); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.5; done
  echo "nothing listens on $1" >&2; return 1
}
N1="$(start n1)"; wait_port "$P1"; sleep 3
coproc R { java "-Dlog4j2.configurationFile=$D/client-log4j2.properties" -cp "$CP" \
  "$HERE/Kafka20734.java" "127.0.0.1:$P1" 2>"$D/driver.err" | grep --line-buffered -v '^\['; }
step() { local line; read -r line <&"${R[0]}"; echo "driver: $line"; }
step # initialised: __transaction_state is on node 1, node 2 is not up yet
N2="$(start n2)"; wait_port "$P2"; sleep 4
echo go >&"${R[1]}"; step # record sent and acknowledged by node 2
kill -STOP "$N2"; echo "node 2 SIGSTOPped for $PAUSE s before the commit"
sleep "$PAUSE"
echo go >&"${R[1]}"
(sleep 2; kill -CONT "$N2"; echo "node 2 SIGCONTed") &
step # committed
sleep 12
echo go >&"${R[1]}"
while read -r line <&"${R[0]}"; do echo "driver: $line"; done
echo "--- node 1 (coordinator) log:"
grep -h "handleBrokerFenced\|handleBrokerUnfenced\|likely deleted" "$D/n1/kafka.log" | cut -c1-300 || true
