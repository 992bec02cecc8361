# shellcheck shell=bash
# Process and port helpers shared by the private-server scripts
# (scripts/kafka.sh, scripts/registry.sh); sourced, not run. The sourcing
# script defines die().

port_in_use() { # port [host] -> 0 if something accepts connections on host:port
  (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null
}

free_port() {
  local p
  if command -v python3 >/dev/null 2>&1 &&
     p="$(python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()' 2>/dev/null)" && [[ -n "$p" ]]; then
    echo "$p"
    return 0
  fi
  local _
  for _ in $(seq 1 200); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 30000 ))
    if ! port_in_use "$p"; then
      echo "$p"
      return 0
    fi
  done
  die "no free port found"
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
