#!/usr/bin/env bash
# A promtool (Prometheus's rule checker and unit-test runner) for kcover's alert-rule tests: taken from
# Debian's `prometheus` package (downloaded with apt-get and unpacked: no daemon is installed or started;
# about 30 s), or, where apt has no such package, built from its Go module
# (github.com/prometheus/prometheus/cmd/promtool) with the installed Go toolchain (about an hour on two
# cores: its dependency tree is large).
#
# Output: ${KCOVER_CACHE:-$HOME/.cache/kcover}/promtool-<ver>/promtool
# The last line printed on stdout is always the path of the promtool binary.
#
# Env overrides:
#   KCOVER_PROMTOOL_BIN      use this promtool binary if it is executable (no build)
#   KCOVER_PROMTOOL_VERSION  Go module version of github.com/prometheus/prometheus (default pinned below)
#   KCOVER_CACHE             cache root
set -euo pipefail

# Pinned: the newest version the Go module proxy served when this was written (v0.316.0 is Prometheus 3.x,
# whose Go module versions are v0.<minor><patch>).
PROMTOOL_VERSION="${KCOVER_PROMTOOL_VERSION:-0.316.0}"

log() { echo "[build-promtool.sh] $*" >&2; }

if [[ -n "${KCOVER_PROMTOOL_BIN:-}" ]]; then
  if [[ -x "$KCOVER_PROMTOOL_BIN" ]]; then
    log "using KCOVER_PROMTOOL_BIN"
    echo "$KCOVER_PROMTOOL_BIN"
    exit 0
  fi
  log "KCOVER_PROMTOOL_BIN=$KCOVER_PROMTOOL_BIN is not executable; building instead"
fi

BIN_DIR="${KCOVER_CACHE:-$HOME/.cache/kcover}/promtool-${PROMTOOL_VERSION}"
PROMTOOL="$BIN_DIR/promtool"

if [[ -x "$PROMTOOL" ]]; then
  log "reused $PROMTOOL"
  echo "$PROMTOOL"
  exit 0
fi

mkdir -p "$BIN_DIR"

# Debian's package first: seconds instead of an hour.
DEB_DIR="${KCOVER_CACHE:-$HOME/.cache/kcover}/promtool-debian"
if [[ -x "$DEB_DIR/promtool" ]]; then
  log "reused $DEB_DIR/promtool"
  echo "$DEB_DIR/promtool"
  exit 0
fi
if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
  work=$(mktemp -d)
  if (cd "$work" && apt-get download prometheus >&2 2>/dev/null) \
      || { apt-get update >&2 2>/dev/null && (cd "$work" && apt-get download prometheus >&2); }; then
    deb=$(ls "$work"/prometheus_*.deb 2>/dev/null | head -n 1 || true)
    if [[ -n "$deb" ]] && dpkg-deb -x "$deb" "$work/root" && [[ -x "$work/root/usr/bin/promtool" ]]; then
      mkdir -p "$DEB_DIR"
      cp "$work/root/usr/bin/promtool" "$DEB_DIR/promtool.partial"
      mv "$DEB_DIR/promtool.partial" "$DEB_DIR/promtool"
      rm -rf "$work"
      log "promtool from Debian's $(basename "$deb")"
      echo "$DEB_DIR/promtool"
      exit 0
    fi
  fi
  rm -rf "$work"
  log "no promtool from apt; building it from its Go module"
fi

command -v go >/dev/null || { log "go is not installed"; exit 1; }

# Serialise concurrent builds (parallel test workers).
exec 9>"$BIN_DIR/.build.lock"
if command -v flock >/dev/null; then
  flock 9
  if [[ -x "$PROMTOOL" ]]; then
    log "reused $PROMTOOL (built by a concurrent run)"
    echo "$PROMTOOL"
    exit 0
  fi
fi

start=$SECONDS
log "==> go install github.com/prometheus/prometheus/cmd/promtool@v${PROMTOOL_VERSION}"
# Build into a staging dir, then move: a half-written binary is never picked up.
STAGE="$BIN_DIR/.stage"
rm -rf "$STAGE"
mkdir -p "$STAGE"
export GOMODCACHE="${GOMODCACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/go-mod}"  # the module cache with the build cache, under ~/.cache
GOBIN="$STAGE" CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod \
  nice -n 10 go install -trimpath -ldflags "-s -w" \
  "github.com/prometheus/prometheus/cmd/promtool@v${PROMTOOL_VERSION}" >&2
mv "$STAGE/promtool" "$PROMTOOL"
rm -rf "$STAGE"
"$PROMTOOL" --version >&2 || true
log "built in $((SECONDS - start))s"
echo "$PROMTOOL"
