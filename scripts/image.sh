#!/usr/bin/env bash
# Builds the container image from docker/Dockerfile and prints its id and size.
#
#   scripts/image.sh                     compile outboxd inside the image (the
#                                        Dockerfile's builder stage, rust:1-bookworm)
#   scripts/image.sh --binary PATH       use a binary built here instead (its
#                                        prebuilt stage); it must link glibc <= 2.36
#   scripts/image.sh --push              push the image after building it
#
#   OUTBOXD_IMAGE   name:tag (default outboxd:<version of Cargo.toml>, the tag
#                   the Helm chart and deploy/kubernetes/outboxd.yaml name)
#   DEBIAN          the runtime base (default debian:bookworm-slim; pin one
#                   with debian:bookworm-slim@sha256:...)
#
# Engine: docker when a Docker daemon answers, else podman (as root, with
# OUTBOXD_PODMAN_FLAGS, default `--runtime runc --cgroup-manager cgroupfs`,
# and rlimits it may not raise: machines with hybrid cgroups need all that).
# Base: used if present, else pulled; where no registry can be reached it is
# made with mmdebstrap from Debian's archive (minbase, bookworm with its
# updates and security suites), cached as a tarball under
# ${OUTBOXD_CACHE:-.cache}/image and imported under the name the Dockerfile
# uses, so a second build reuses it.
#
# The last line on stdout is machine-readable: `<name:tag> <image id> <bytes>`.
# Build layers stay as the cache of the next build (each new binary adds
# about two copies of it); `podman image prune` (or docker's) frees them,
# and the next build then starts from the base again (about 30 s).
set -euo pipefail
cd "$(dirname "$0")/.."

binary="" push=false
while (($#)); do
  case $1 in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --push) push=true; shift ;;
    *) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
image=${OUTBOXD_IMAGE:-outboxd:$version}
base=${DEBIAN:-debian:bookworm-slim}
cache="${OUTBOXD_CACHE:-$PWD/.cache}/image"

say() { echo "image: $*" >&2; }

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  engine=(docker)
  build_flags=()
else
  if ! command -v podman >/dev/null; then
    say "neither a Docker daemon nor podman (scripts/setup.sh installs podman)"
    exit 1
  fi
  read -r -a podman_flags <<<"${OUTBOXD_PODMAN_FLAGS---runtime runc --cgroup-manager cgroupfs}"
  engine=(podman "${podman_flags[@]}")
  # Docker's format keeps HEALTHCHECK (OCI's has no field for it). RUN steps
  # use the host's network (apt in the rootfs stage) and rlimits no higher
  # than the host lets a container have.
  build_flags=(--format docker --network host --ulimit nofile=1024:1024 --ulimit nproc=1000:1000)
fi

# The Debian base: present, pulled, or made. Only a plain name:tag can be
# made; a pinned digest has to come from a registry.
ensure_base() {
  if "${engine[@]}" image inspect "$base" >/dev/null 2>&1; then return; fi
  say "pulling $base"
  if timeout 120 "${engine[@]}" pull -q "docker.io/library/$base" >/dev/null 2>&1; then return; fi
  if [[ $base != debian:*-slim ]]; then
    say "cannot pull $base, and only debian:<suite>-slim can be made here"
    exit 1
  fi
  local suite=${base#debian:} tar
  suite=${suite%-slim}
  tar="$cache/debian-$suite-slim.tar"
  if [[ ! -s $tar ]]; then
    command -v mmdebstrap >/dev/null || { say "no registry and no mmdebstrap (scripts/setup.sh)"; exit 1; }
    say "no registry: making $base with mmdebstrap into $tar"
    mkdir -p "$cache"
    local mirror=http://deb.debian.org/debian
    mmdebstrap --quiet --variant=minbase --format=tar \
      --aptopt='Acquire::Languages "none"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      "$suite" "$tar.part" \
      "deb $mirror $suite main" "deb $mirror $suite-updates main" \
      "deb http://deb.debian.org/debian-security $suite-security main"
    mv "$tar.part" "$tar"
  fi
  local name=$base
  [[ ${engine[0]} == podman ]] && name=docker.io/library/$base
  "${engine[@]}" import -q \
    --change 'CMD ["bash"]' \
    --change "LABEL org.opencontainers.image.description=$base made by mmdebstrap" \
    "$tar" "$name" >/dev/null
}
ensure_base

args=(-f docker/Dockerfile -t "$image" --build-arg "DEBIAN=$base")
if [[ -n $binary ]]; then
  [[ -x $binary ]] || { say "$binary: not an executable"; exit 1; }
  # The build context holds the binary alone, under the name the
  # Dockerfile copies.
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  # Without debug info, as the builder stage makes it (symbols stay).
  if command -v objcopy >/dev/null; then
    objcopy --strip-debug "$binary" "$ctx/outboxd"
  else
    cp "$binary" "$ctx/outboxd"
  fi
  args+=(--build-arg OUTBOXD_BINARY=prebuilt --build-context "outboxd-bin=$ctx")
fi

started=$SECONDS
"${engine[@]}" build -q "${build_flags[@]}" "${args[@]}" . >/dev/null
id=$("${engine[@]}" image inspect --format '{{.Id}}' "$image")
size=$("${engine[@]}" image inspect --format '{{.Size}}' "$image")
say "built $image in $((SECONDS - started)) s: $((size / 1024 / 1024)) MiB"
if $push; then
  "${engine[@]}" push "$image"
fi
echo "$image $id $size"
