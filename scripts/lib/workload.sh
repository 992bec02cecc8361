# shellcheck shell=bash disable=SC2034 # the variables set here are for the sourcing script
# What scripts/bench.sh and scripts/profile.sh share (sourced, not run): the
# benchmark payload and the /proc readings. Needs servers_psql
# (scripts/lib/servers.sh) for size_payload.
#
#   payload_sql PAD      the payload's SQL (pgbench variables :client_id, :agg, row g)
#   size_payload         sets $pad so that the payload is $payload_bytes bytes
#   ticks PID            utime+stime of PID (or PID/task/TID) in clock ticks; 0 if gone
#   peak_rss_kib PID     VmHWM of PID in KiB; 0 if gone

payload_bytes=374

# A 374-byte payload: fixed-width fields, padded by a note. Its field "t" is
# the writer's clock in microseconds.
payload_sql() { # pad
  echo "jsonb_build_object('t', (extract(epoch FROM clock_timestamp()) * 1000000)::int8,
      'orderId', lpad((:client_id * 100000000 + g)::text, 10, '0'), 'amount', '100.50', 'currency', 'RUB',
      'customer', 'c-' || lpad(:agg::text, 3, '0'), 'note', '$1')"
}
pad=
size_payload() {
  local base
  base=$(servers_psql postgres -At -c \
    "SELECT octet_length($(payload_sql '' | sed 's/:client_id/0/; s/:agg/0/; s/\bg\b/1/')::text)")
  ((base < payload_bytes)) || { echo "payload without note is already $base bytes" >&2; exit 1; }
  pad=$(printf '%*s' $((payload_bytes - base)) '' | tr ' ' 'x')
}

ticks() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  local -a f
  read -r -a f <<<"${stat##*) }" # f[0] is field 3 (state)
  echo $((f[11] + f[12]))
}
# The whole host's CPU ticks so far, busy and in all ("busy total"), from
# /proc/stat's first line: user nice system idle iowait irq softirq steal.
host_ticks() {
  local -a f
  read -r -a f </proc/stat
  echo "$((f[1] + f[2] + f[3] + f[6] + f[7] + f[8])) $((f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7] + f[8]))"
}
peak_rss_kib() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$1/status" 2>/dev/null || echo 0; }
