#!/usr/bin/env bash
# The stability run: integration test modules with a timing bound, each run
# RUNS times in a row beside two CPU-bound processes, to find the tests that
# flake on a busy host.
#
#   scripts/stability.sh [RUNS] [FILTER...]   default 20 runs of the modules below
#   scripts/stability.sh 5 relay::faults:: relay::cluster::
#
# A FILTER is a prefix of test names in the integration binary (tests/main.rs),
# e.g. `relay::faults::` (end it with `::` so that relay::exactly_once:: does not
# also take relay::exactly_once_ops::). The default list leaves out
# relay::cluster:: (a 3-broker cluster per run is heavy, and only one can run
# on a host at a time); name it to include it.
#
# The test binary is built once, then run directly for each run, with the
# matching tests named exactly. Beside it, two `yes > /dev/null` (nice 0) keep
# both cores of a small host busy; they are stopped on exit.
#
# Results in STABILITY_DIR (default target/stability/<UTC time>):
#   runs.tsv              filter, run, result (pass/fail), seconds, 1-minute load average at start
#   <filter>-<run>.log    the whole output of each failed run (the relay's log is in it)
# and a summary per filter on stdout (and in summary.txt): runs, passes, failures,
# seconds min/median/max, load at start min-max.
# The exit status is 1 if any run failed.
#
# Environment: STABILITY_DIR; STABILITY_LOAD (number of `yes`, default 2, 0 for
# none); STABILITY_ROUNDS=1 to go round-robin (run 1 of every filter, then
# run 2, ...) instead of each filter's runs in a row; STABILITY_UNTIL (a time
# `date -d` reads, e.g. 04:00) to start no run after it, the summary then
# saying how many runs were made; STABILITY_TEST_ARGS extra arguments for the
# test binary (e.g. "--test-threads=1").
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
}
[[ ${1:-} == -h || ${1:-} == --help ]] && usage

runs=${1:-20}
[[ $runs =~ ^[1-9][0-9]*$ ]] || usage
shift || true
filters=("$@")
if ((${#filters[@]} == 0)); then
  filters=(
    ops::readiness:: ops::metrics:: relay::standby:: relay::ledger_acks::
    relay::stuck_producer:: relay::slow_commits:: relay::faults::
    relay::exactly_once:: relay::exactly_once_ops:: relay::exactly_once_faults::
  )
fi
out=${STABILITY_DIR:-${CARGO_TARGET_DIR:-$root/target}/stability/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
until_epoch=
[[ -n ${STABILITY_UNTIL:-} ]] && until_epoch=$(date -d "$STABILITY_UNTIL" +%s)
read -ra test_args <<<"${STABILITY_TEST_ARGS:-}"

export RUST_BACKTRACE=${RUST_BACKTRACE:-0}
bin=$(cargo test --locked --test main --no-run --message-format=json 2>/dev/null |
  jq -r 'select(.reason == "compiler-artifact" and .target.name == "main"
                and .profile.test == true) | .executable')
[[ -x $bin ]] || { echo "stability: the test binary was not built" >&2; exit 1; }

# Each filter's tests by exact name, so that a prefix never takes a longer module.
declare -A tests
all=$("$bin" --list 2>/dev/null | sed -n 's/: test$//p')
for f in "${filters[@]}"; do
  names=$(grep -F -- "$f" <<<"$all" | awk -v f="$f" 'index($0, f) == 1' || true)
  [[ -n $names ]] || { echo "stability: no test starts with '$f'" >&2; exit 2; }
  tests[$f]=$names
done

pids=()
stop_load() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap stop_load EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < ${STABILITY_LOAD:-2}; i++)); do
  nice -n 0 yes >/dev/null &
  pids+=($!)
done

printf 'filter\trun\tresult\tseconds\tload1\n' >"$out/runs.tsv"
echo "stability: $runs runs of ${#filters[@]} filters, ${STABILITY_LOAD:-2} \`yes\` beside; results in $out" >&2

one_run() { # filter run
  local f=$1 n=$2 load start secs result log
  load=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s.%N)
  log=$out/${f//::/_}-$n.log
  log=${log/%_-$n.log/-$n.log}
  # shellcheck disable=SC2086 # one test name a line, none has a space
  if "$bin" --exact ${tests[$f]} "${test_args[@]}" >"$log" 2>&1; then
    result=pass
    rm -f "$log"
  else
    result=fail
  fi
  secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { print e - s }')
  printf '%s\t%d\t%s\t%.1f\t%s\n' "$f" "$n" "$result" "$secs" "$load" >>"$out/runs.tsv"
  printf '%s run %d: %s in %.0f s (load %s)\n' "$f" "$n" "$result" "$secs" "$load" >&2
}

late() { [[ -n $until_epoch ]] && (($(date +%s) >= until_epoch)); }

if [[ ${STABILITY_ROUNDS:-0} == 1 ]]; then
  for ((n = 1; n <= runs; n++)); do
    for f in "${filters[@]}"; do
      late && break 2
      one_run "$f" "$n"
    done
  done
else
  for f in "${filters[@]}"; do
    for ((n = 1; n <= runs; n++)); do
      late && break 2
      one_run "$f" "$n"
    done
  done
fi

# Per filter: runs, passes, failures, seconds min/median/max, load min/max.
awk -F'\t' 'NR > 1 {
    k = $1; if (!(k in runs)) order[++nk] = k
    runs[k]++; if ($3 == "pass") pass[k]++; else fail[k]++
    secs[k, runs[k]] = $4
    if (!(k in lo) || $5 < lo[k]) lo[k] = $5 + 0
    if ($5 > hi[k]) hi[k] = $5 + 0
  }
  END {
    printf "%-32s %5s %5s %5s %8s %8s %8s  %s\n", "filter", "runs", "pass", "fail", "min s", "median s", "max s", "load1 at start min-max"
    for (i = 1; i <= nk; i++) {
      k = order[i]; n = runs[k]
      for (a = 1; a <= n; a++) v[a] = secs[k, a] + 0
      for (a = 1; a <= n; a++) for (b = a + 1; b <= n; b++) if (v[b] < v[a]) { t = v[a]; v[a] = v[b]; v[b] = t }
      med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      printf "%-32s %5d %5d %5d %8.1f %8.1f %8.1f  %.2f-%.2f\n", k, n, pass[k], fail[k], v[1], med, v[n], lo[k], hi[k]
    }
  }' "$out/runs.tsv" | tee "$out/summary.txt"
! grep -q $'\tfail\t' "$out/runs.tsv"
