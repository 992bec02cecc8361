#!/usr/bin/env bash
# The whole test suite: formatting and lints, unit and property tests, and the
# integration suite against real PostgreSQL and Kafka servers it starts
# itself; then the PostgreSQL source suite again on PostgreSQL 14, 16, 17, 18.
#
#   scripts/test.sh            everything
#   OUTBOXD_PG_VERSIONS="16"   limit the extra PostgreSQL versions ("" = none)
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

scripts/setup.sh

# The Helm chart's tools (helm is built from source once, then cached):
# fetched before the tests so the build does not compete with them.
scripts/helm.sh fetch >/dev/null
# The schema registry of tests/registry (Maven Central, cached).
scripts/registry.sh fetch >/dev/null
# The Python clients relay::formats reads records back with (PyPI, cached).
scripts/python.sh >/dev/null

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings

# CI shows the end of a failed run's output: a test's backtrace would push
# its panic message (which names the step and what the system showed) out.
export RUST_BACKTRACE=0

echo "== unit, property and integration tests (PostgreSQL 15)"
cargo test --locked

# The source suite on the other PostgreSQL versions, all at once: each run
# spends most of its time waiting on its own server (free ports, its own
# data directory), so together they take about as long as the slowest.
read -ra versions <<<"${OUTBOXD_PG_VERSIONS-14 16 17 18}"
for v in "${versions[@]}"; do
  scripts/postgres.sh bin "$v" >/dev/null
done
logs=$(mktemp -d)
pids=()
for v in "${versions[@]}"; do
  OUTBOXD_TEST_PG_VERSION=$v cargo test --locked --test main source:: \
    >"$logs/$v.log" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!versions[@]}"; do
  v=${versions[$i]}
  wait "${pids[$i]}" || failed+=("$v")
  echo "== source suite on PostgreSQL $v"
  cat "$logs/$v.log"
done
rm -rf "$logs"
if ((${#failed[@]})); then
  echo "== the source suite failed on PostgreSQL ${failed[*]}"
  exit 1
fi

echo "== all tests passed in $((SECONDS - started)) s"
