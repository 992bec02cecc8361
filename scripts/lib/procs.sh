# shellcheck shell=bash
# Process and port helpers shared by the private-server scripts
# (scripts/kafka.sh, scripts/registry.sh); sourced, not run. The sourcing
# script defines die().

port_in_use() { # port [host] -> 0 if something accepts connections on host:port
  (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null
}

# A port for a server to listen on. Not one the kernel hands out for port 0:
# that comes from the ephemeral range, which every outgoing connection (the
# suite's Kafka and PostgreSQL clients) draws its local port from too, so one
# of them can take it before the server binds it (a stability run,
# 2026-12-06: a broker's "Socket server failed to bind to 127.0.0.1:43137:
# Address already in use"). Below that range only listeners take ports; the
# test harness's free_port (tests/harness/http.rs) picks from there too.
free_port() {
  local low=10000 high p _
  high=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null) || high=
  [[ $high =~ ^[0-9]+$ ]] && ((high > low + 1000)) || high=32768
  for _ in $(seq 1 200); do
    p=$((low + (RANDOM * 32768 + RANDOM) % (high - low)))
    if command -v python3 >/dev/null 2>&1; then
      python3 -c 'import socket, sys
socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$p" 2>/dev/null || continue
    elif port_in_use "$p"; then
      continue
    fi
    echo "$p"
    return 0
  done
  die "no free port in $low..$high"
}

# A process that exists and is not a zombie. Orphaned JVMs are re-parented to PID 1, which
# on some machines reaps only now and then, and kill -0 succeeds on a zombie.
alive() {
  local st
  [[ -n "${1:-}" ]] || return 1
  st="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  st="${st##*) }"
  [[ "${st:0:1}" != Z && "${st:0:1}" != X ]]
}

read_pid() { # file -> pid or empty
  if [[ -f "$1" ]]; then tr -dc '0-9' <"$1"; fi
}
