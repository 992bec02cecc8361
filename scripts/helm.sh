#!/usr/bin/env bash
# The Helm chart's tools, fetched once into the cache, and the chart's checks.
#
#   scripts/helm.sh fetch      build helm (Go module proxy) and install kubernetes-validate
#                              (PyPI) into the cache; print the helm binary's path
#   scripts/helm.sh validator  print the kubernetes-validate command's path (fetching it)
#   scripts/helm.sh render     write deploy/kubernetes/outboxd.yaml from the chart's defaults
#
# Environment:
#   OUTBOXD_CACHE   cache root (default <repo>/.cache)
#   HELM_VERSION    helm.sh/helm/v3 version (default below)
#   KUBERNETES_VALIDATE_VERSION  PyPI version (default below)
#
# helm is built from source with the machine's Go (`go install`), because
# release binaries come from a download site these machines cannot reach.
# Progress goes to stderr; stdout carries only the result.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
KUBERNETES_VALIDATE_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"
CACHE_ROOT="${OUTBOXD_CACHE:-$REPO_DIR/.cache}"
HELM_BIN="$CACHE_ROOT/helm/$HELM_VERSION/helm"
VALIDATE_VENV="$CACHE_ROOT/kubernetes-validate/venv-$KUBERNETES_VALIDATE_VERSION"

log() { echo "helm.sh: $*" >&2; }
die() { log "$*"; exit 1; }

fetch_helm() {
  if [[ ! -x "$HELM_BIN" ]]; then
    command -v go >/dev/null || die "go not found: helm is built with the Go toolchain (go install); install Go first"
    log "building helm $HELM_VERSION (once; cached in $(dirname "$HELM_BIN"))"
    mkdir -p "$(dirname "$HELM_BIN")"
    # A private GOPATH would throw the module cache away with the build; the
    # default one is shared with any other Go work on the machine.
    GOBIN="$(dirname "$HELM_BIN")" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  fi
  echo "$HELM_BIN"
}

fetch_validator() {
  if [[ ! -x "$VALIDATE_VENV/bin/kubernetes-validate" ]]; then
    log "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION (once; cached in $VALIDATE_VENV)"
    rm -rf "$VALIDATE_VENV"
    mkdir -p "$(dirname "$VALIDATE_VENV")"
    python3 -m venv "$VALIDATE_VENV" >&2
    "$VALIDATE_VENV/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" >&2
  fi
  echo "$VALIDATE_VENV/bin/kubernetes-validate"
}

render() {
  local helm out
  helm="$(fetch_helm)"
  out="$REPO_DIR/deploy/kubernetes/outboxd.yaml"
  mkdir -p "$(dirname "$out")"
  {
    echo "# Rendered from deploy/helm/outboxd with its default values by"
    echo "# \`scripts/helm.sh render\` (the test suite checks it is up to date)."
    echo "# Edit the ConfigMap's outboxd.toml and the image, then kubectl apply -f."
    "$helm" template outboxd "$REPO_DIR/deploy/helm/outboxd" --namespace default
  } >"$out"
  log "wrote $out"
}

case "${1:-}" in
  fetch) fetch_helm; fetch_validator >/dev/null ;;
  validator) fetch_validator ;;
  render) render ;;
  *) die "usage: scripts/helm.sh fetch|validator|render" ;;
esac
