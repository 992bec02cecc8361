# shellcheck shell=bash
# Debezium's PostgreSQL connector with the Outbox EventRouter on Kafka Connect
# standalone, as scripts/bench.sh and scripts/debezium_compare.sh run it
# (sourced, not run; needs scripts/lib/servers.sh for KAFKA_BROKERS, PG_PORT
# and servers_free_port). The files get the settings both share; each script
# appends what is its own (database, table, columns, routing, producer) with
# `cat >>`.
#
#   connect_files DIR DB FLUSH_MS LOG_LEVEL
#       DIR/worker.properties (StringConverter for keys and values, offsets
#       in DIR/connect.offsets flushed every FLUSH_MS), DIR/outbox.properties
#       (the connector on database DB, slot `debezium`, an existing
#       publication, no snapshot, the EventRouter with the event id in
#       column `id`) and DIR/log4j2.properties (console at LOG_LEVEL)
#   connect_run DIR LIBS HEAP_OPTION...
#       runs ConnectStandalone on DIR's files with the jars in LIBS
#       (scripts/debezium.sh fetch); it replaces the shell it runs in, so
#       `connect_run … &` leaves the JVM's pid in $!

connect_files() {
  local dir=$1 db=$2 flush_ms=$3 level=$4
  cat >"$dir/worker.properties" <<CONF
bootstrap.servers=$KAFKA_BROKERS
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=$dir/connect.offsets
offset.flush.interval.ms=$flush_ms
plugin.discovery=service_load
listeners=http://127.0.0.1:$(servers_free_port)
CONF
  cat >"$dir/outbox.properties" <<CONF
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
plugin.name=pgoutput
database.hostname=127.0.0.1
database.port=$PG_PORT
database.user=postgres
database.password=unused
database.dbname=$db
slot.name=debezium
publication.autocreate.mode=disabled
snapshot.mode=no_data
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id=id
CONF
  cat >"$dir/log4j2.properties" <<CONF
rootLogger.level=$level
rootLogger.appenderRef.out.ref=out
appender.out.type=Console
appender.out.name=out
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=%d{HH:mm:ss.SSS} %-5p %c{1}: %m%n
CONF
}

connect_run() {
  local dir=$1 libs=$2
  shift 2
  exec java "$@" -Dlog4j2.configurationFile="$dir/log4j2.properties" -cp "$libs/*" \
    org.apache.kafka.connect.cli.ConnectStandalone "$dir/worker.properties" "$dir/outbox.properties"
}
