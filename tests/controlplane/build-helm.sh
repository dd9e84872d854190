#!/usr/bin/env bash
# Build a pinned Helm CLI from its Go module (helm.sh/helm/v3) for kcover's chart tests,
# using the installed Go toolchain and the Go module proxy. No prebuilt binary is downloaded.
#
# Output: ${KCOVER_CACHE:-$HOME/.cache/kcover}/helm-<ver>/helm
# The last line printed on stdout is always the path of the helm binary.
#
# Env overrides:
#   KCOVER_HELM_BIN      use this helm binary if it is executable (no build)
#   KCOVER_HELM_VERSION  Helm version (default pinned below)
#   KCOVER_CACHE         cache root
set -euo pipefail

# Pinned: the newest v3 release served by the Go module proxy when this was written.
HELM_VERSION="${KCOVER_HELM_VERSION:-3.22.0}"

log() { echo "[build-helm.sh] $*" >&2; }

if [[ -n "${KCOVER_HELM_BIN:-}" ]]; then
  if [[ -x "$KCOVER_HELM_BIN" ]]; then
    log "using KCOVER_HELM_BIN"
    echo "$KCOVER_HELM_BIN"
    exit 0
  fi
  log "KCOVER_HELM_BIN=$KCOVER_HELM_BIN is not executable; building instead"
fi

BIN_DIR="${KCOVER_CACHE:-$HOME/.cache/kcover}/helm-${HELM_VERSION}"
HELM="$BIN_DIR/helm"

if [[ -x "$HELM" ]]; then
  log "reused $HELM"
  echo "$HELM"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed"; exit 1; }
mkdir -p "$BIN_DIR"

# Serialise concurrent builds (parallel test workers).
exec 9>"$BIN_DIR/.build.lock"
if command -v flock >/dev/null; then
  flock 9
  if [[ -x "$HELM" ]]; then
    log "reused $HELM (built by a concurrent run)"
    echo "$HELM"
    exit 0
  fi
fi

start=$SECONDS
log "==> go install helm.sh/helm/v3/cmd/helm@v${HELM_VERSION}"
# Build into a staging dir, then move: a half-written binary is never picked up.
STAGE="$BIN_DIR/.stage"
rm -rf "$STAGE"
mkdir -p "$STAGE"
# helm's version package reads these at link time; `helm version` then reports the pinned release.
LDF="-s -w -X helm.sh/helm/v3/internal/version.version=v${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
export GOMODCACHE="${GOMODCACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/go-mod}"  # the module cache with the build cache, under ~/.cache
GOBIN="$STAGE" CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod \
  nice -n 10 go install -trimpath -ldflags "$LDF" "helm.sh/helm/v3/cmd/helm@v${HELM_VERSION}" >&2
mv "$STAGE/helm" "$HELM"
rm -rf "$STAGE"
"$HELM" version >&2 || true
log "built in $((SECONDS - start))s"
echo "$HELM"
