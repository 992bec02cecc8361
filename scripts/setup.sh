#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test outboxd:
# C toolchain pieces for librdkafka (rdkafka-sys builds it from source;
# libsasl2-dev only with OUTBOXD_FEATURES=gssapi, for `--features gssapi`;
# libcurl's headers only with OUTBOXD_FEATURES=system-curl, for baselines),
# PostgreSQL 15 server and client, Java 17 and Maven for the Kafka broker
# (and Java 21+ for the schema registry, where Debian packages one),
# Prometheus (its server and promtool check the dashboards and alert rules in
# docker/), python3-venv for the test clients' venvs (scripts/python.sh,
# scripts/helm.sh), podman with runc and mmdebstrap (the tests build and run
# the container image; mmdebstrap makes its base where no registry can be
# reached: scripts/image.sh), and the unprivileged user that runs test
# servers when we are root. No libcurl headers: rdkafka's curl-static
# feature builds libcurl from source.
# Idempotent: does nothing (and asks no registry) when all is present.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libssl-dev zlib1g-dev libzstd-dev
  postgresql-15 postgresql-client-15 openssl openjdk-17-jre-headless maven python3 python3-venv curl prometheus
  podman runc mmdebstrap)
if [[ ,${OUTBOXD_FEATURES:-}, == *,gssapi,* ]]; then packages+=(libsasl2-dev); fi
# Revisions built before rdkafka's curl-static feature (bench baselines).
if [[ ,${OUTBOXD_FEATURES:-}, == *,system-curl,* ]]; then packages+=(libcurl4-openssl-dev); fi
# apt-get that waits (up to 10 minutes) for another apt or dpkg, such as
# unattended-upgrades on a fresh machine, instead of failing on its lock.
# DPkg::Lock::Timeout covers the dpkg lock; `update` takes the lists lock,
# which older apt does not wait for, so a lock failure is retried too.
apt_wait() {
  local deadline=$((SECONDS + 600)) out
  while :; do
    if out=$(apt-get -o DPkg::Lock::Timeout=600 "$@" 2>&1); then
      [[ -z $out ]] || printf '%s\n' "$out"
      return 0
    fi
    if [[ $out != *"Could not get lock"* && $out != *"Unable to lock"* ]] || ((SECONDS >= deadline)); then
      printf '%s\n' "$out" >&2
      return 1
    fi
    echo "setup: waiting for another apt/dpkg to finish" >&2
    sleep 5
  done
}

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
  apt_wait update -qq
  apt_wait install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Apicurio Registry (scripts/registry.sh, the schema registry of the tests)
# needs Java 21 or newer; Kafka's Java 17 is not enough. Debian 13 packages
# OpenJDK 21 and 25; Debian 12 has only 17, so there a JDK 21+ has to be put
# under /usr/lib/jvm (or named by JAVA) by other means.
if ! scripts/registry.sh java >/dev/null 2>&1; then
  if [[ $(id -u) != 0 ]]; then
    echo "setup: no Java 21+ for the schema registry tests (run as root, or install one)" >&2
    exit 1
  fi
  apt_wait update -qq
  java_pkg=
  for p in openjdk-25-jre-headless openjdk-21-jre-headless; do
    if apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
      java_pkg=$p
      break
    fi
  done
  if [[ -n $java_pkg ]]; then
    echo "setup: installing $java_pkg (Java 21+ for the schema registry)" >&2
    DEBIAN_FRONTEND=noninteractive apt_wait install -y -qq --no-install-recommends "$java_pkg" >/dev/null
  else
    echo "setup: warning: this Debian release packages no Java 21+; the schema registry tests" \
      "(tests/registry) need one under /usr/lib/jvm or named by JAVA" >&2
  fi
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust stable (rustup) first" >&2
  exit 1
fi

if [[ $(id -u) == 0 ]]; then
  scripts/postgres.sh ensure-user >/dev/null
fi
