#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test outboxd:
# C toolchain pieces for librdkafka (rdkafka-sys builds it from source),
# PostgreSQL 15 server and client, Java 17 and Maven for the Kafka broker,
# Prometheus (its server and promtool check the dashboards and alert rules in
# docker/), and the unprivileged user that runs test servers when we are root.
# Idempotent: does nothing (and asks no registry) when all is present.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libssl-dev libcurl4-openssl-dev libsasl2-dev zlib1g-dev libzstd-dev
  postgresql-15 postgresql-client-15 openssl openjdk-17-jre-headless maven python3 curl prometheus)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# The machine may carry Java/Maven outside Debian's packages; that is enough.
if command -v java >/dev/null && java -version 2>&1 | grep -q 'version "17'; then
  missing=("${missing[@]/openjdk-17-jre-headless/}")
fi
if command -v mvn >/dev/null; then missing=("${missing[@]/maven/}"); fi
read -r -a missing <<<"${missing[*]}"

if ((${#missing[@]})); then
  if [[ $(id -u) != 0 ]]; then
    echo "setup: missing packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust stable (rustup) first" >&2
  exit 1
fi

if [[ $(id -u) == 0 ]]; then
  scripts/postgres.sh ensure-user >/dev/null
fi
