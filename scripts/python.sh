#!/usr/bin/env bash
# The Python clients the integration tests read records back with, installed
# once from PyPI into a venv in the cache:
#
#   cloudevents        the CloudEvents SDK; its Kafka binding (from_binary,
#                      from_structured) parses the cloudevents-* formats
#   opentelemetry-api  OpenTelemetry's W3C trace-context propagator parses
#                      the traceparent / tracestate headers
#   confluent-kafka    Confluent's client: its AvroDeserializer and
#                      JSONDeserializer, with a SchemaRegistryClient, decode
#                      the avro and json-schema value formats (extras avro,
#                      json and schemaregistry: fastavro, jsonschema, httpx, ...)
#
#   scripts/python.sh          install if missing; print the venv's python
#
# Environment:
#   OUTBOXD_CACHE   cache root (default <repo>/.cache)
#
# Versions are pinned so a test run is the same on every machine; a new pin
# is a new venv directory. Progress goes to stderr; stdout carries only the
# interpreter's path.
set -euo pipefail

CLOUDEVENTS_VERSION="${CLOUDEVENTS_VERSION:-2.2.0}"
OPENTELEMETRY_API_VERSION="${OPENTELEMETRY_API_VERSION:-1.45.2}"
CONFLUENT_KAFKA_VERSION="${CONFLUENT_KAFKA_VERSION:-2.16.1}"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"
CACHE_ROOT="${OUTBOXD_CACHE:-$REPO_DIR/.cache}"
CONFLUENT_KAFKA_EXTRAS="avro,json,schemaregistry"
VENV="$CACHE_ROOT/python/venv-cloudevents-$CLOUDEVENTS_VERSION-otel-$OPENTELEMETRY_API_VERSION-ck-$CONFLUENT_KAFKA_VERSION-${CONFLUENT_KAFKA_EXTRAS//,/-}"

log() { echo "python.sh: $*" >&2; }

if [[ ! -f "$VENV/.complete" ]]; then
  command -v python3 >/dev/null || { log "python3 not found; run scripts/setup.sh"; exit 1; }
  mkdir -p "$(dirname "$VENV")"
  # Tests run in parallel: one installs, the others wait for it (a venv
  # records its own path, so it is built where it will live).
  exec 9>"$VENV.lock"
  flock 9
  if [[ ! -f "$VENV/.complete" ]]; then
    log "installing cloudevents $CLOUDEVENTS_VERSION, opentelemetry-api $OPENTELEMETRY_API_VERSION and confluent-kafka[$CONFLUENT_KAFKA_EXTRAS] $CONFLUENT_KAFKA_VERSION (once; cached in $VENV)"
    rm -rf "$VENV"
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install -q --disable-pip-version-check \
      "cloudevents==$CLOUDEVENTS_VERSION" "opentelemetry-api==$OPENTELEMETRY_API_VERSION" \
      "confluent-kafka[$CONFLUENT_KAFKA_EXTRAS]==$CONFLUENT_KAFKA_VERSION" >&2
    touch "$VENV/.complete"
  fi
fi
echo "$VENV/bin/python"
