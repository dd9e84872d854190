#!/usr/bin/env bash
# Build the pinned components of the `node` test backend from their Go modules, with the installed Go
# toolchain: kubelet and kube-proxy (from the same k8s.io/kubernetes version and go.mod recipe as
# build-cluster.sh), the JobSet controller (sigs.k8s.io/jobset) with its CRD and webhook manifests
# (copied from the module source), and kcover-pause, the pod sandbox's process (tests/controlplane/pause).
#
# Output: ${KCOVER_CACHE:-$HOME/.cache/kcover}/node/k8s-<ver>-jobset-<ver>/
#           {kubelet,kube-proxy,jobset-controller,kcover-pause,crds/*.yaml,webhooks/*.yaml,versions.env}
# The last line printed on stdout is always that directory.
#
# Restartable: every binary is built to a .partial name and renamed when complete, and a rerun builds
# only what is missing (the Go build cache keeps the packages an interrupted build finished).
#
# Env overrides:
#   KCOVER_NODE_BIN        use this dir if it holds every component (no build)
#   KCOVER_K8S_VERSION     Kubernetes version (default: build.sh's pin)
#   KCOVER_JOBSET_VERSION  JobSet version
#   KCOVER_CACHE           cache root
set -euo pipefail

K8S_VERSION="${KCOVER_K8S_VERSION:-1.36.3}"
# The newest JobSet release the Go module proxy serves that builds against Kubernetes 0.36 modules.
JOBSET_VERSION="${KCOVER_JOBSET_VERSION:-0.12.0}"
COMPONENTS=(kubelet kube-proxy jobset-controller kcover-pause)
HERE="$(cd "$(dirname "$0")" && pwd)"

log() { echo "[build-node.sh] $*" >&2; }

complete() {
  local d=$1 c
  for c in "${COMPONENTS[@]}"; do [[ -x "$d/$c" ]] || return 1; done
  [[ -f "$d/versions.env" ]] && compgen -G "$d/crds/*.yaml" >/dev/null && compgen -G "$d/webhooks/*.yaml" >/dev/null
}

if [[ -n "${KCOVER_NODE_BIN:-}" ]]; then
  if complete "$KCOVER_NODE_BIN"; then
    log "using KCOVER_NODE_BIN"
    echo "$KCOVER_NODE_BIN"
    exit 0
  fi
  log "KCOVER_NODE_BIN=$KCOVER_NODE_BIN is incomplete; building instead"
fi

CACHE_ROOT="${KCOVER_CACHE:-$HOME/.cache/kcover}/node"
BIN_DIR="$CACHE_ROOT/k8s-${K8S_VERSION}-jobset-${JOBSET_VERSION}"

if complete "$BIN_DIR"; then
  log "reused $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed"; exit 1; }
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build.lock"
if command -v flock >/dev/null; then
  flock 9
  if complete "$BIN_DIR"; then
    log "reused $BIN_DIR (built by a concurrent run)"
    echo "$BIN_DIR"
    exit 0
  fi
fi

export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off
export GOMODCACHE="${GOMODCACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/go-mod}"  # the module cache with the build cache, under ~/.cache
NICE=(nice -n 10)
STAGING_VERSION="v0.${K8S_VERSION#1.}"
WORK="$CACHE_ROOT/build-$(basename "$BIN_DIR")"
OUT="$WORK/out"
mkdir -p "$WORK/k8s" "$WORK/jobset" "$WORK/pause" "$OUT/crds" "$OUT/webhooks"
total_start=$SECONDS
step_start=0
step() { step_start=$SECONDS; log "==> $*"; }
step_done() { log "    done in $((SECONDS - step_start))s"; }

# ---------------------------------------------------------------- kcover-pause (the sandbox's process)
if [[ ! -x "$OUT/kcover-pause" ]]; then
  step "kcover-pause: go build"
  cp "$HERE/pause/main.go" "$WORK/pause/main.go"
  printf 'module kcover.local/build/pause\n\ngo 1.26.0\n' > "$WORK/pause/go.mod"
  (cd "$WORK/pause" && "${NICE[@]}" go build -trimpath -ldflags "-s -w" -o "$OUT/kcover-pause.partial" . >&2)
  mv "$OUT/kcover-pause.partial" "$OUT/kcover-pause"
  step_done
fi

# ---------------------------------------------------------------- JobSet controller (+ its CRD and webhooks)
if [[ ! -x "$OUT/jobset-controller" ]]; then
  step "jobset v${JOBSET_VERSION}: resolve modules"
  cd "$WORK/jobset"
  # The module's main package is its root (main.go); build it from the module's own go.mod and go.sum.
  JOBSET_DIR="$(go mod download -json "sigs.k8s.io/jobset@v${JOBSET_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -f "$JOBSET_DIR/main.go" ]] || { log "no main.go in sigs.k8s.io/jobset@v${JOBSET_VERSION} ($JOBSET_DIR)"; exit 1; }
  step_done
  step "jobset v${JOBSET_VERSION}: go build sigs.k8s.io/jobset"
  (cd "$JOBSET_DIR" && "${NICE[@]}" go build -trimpath -mod=readonly \
      -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=v${JOBSET_VERSION}" \
      -o "$OUT/jobset-controller.partial" . >&2)
  mv "$OUT/jobset-controller.partial" "$OUT/jobset-controller"
  step_done
fi
# ---------------------------------------------------------------- kubelet, kube-proxy
if [[ ! -x "$OUT/kubelet" || ! -x "$OUT/kube-proxy" ]]; then
  step "kubernetes v${K8S_VERSION}: resolve modules"
  cd "$WORK/k8s"
  K8S_GOMOD="$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [[ -f "$K8S_GOMOD" ]] || { log "could not download k8s.io/kubernetes@v${K8S_VERSION} go.mod"; exit 1; }
  mapfile -t STAGING < <(grep -E '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging/src/' "$K8S_GOMOD" \
    | awk '{print $1}' | grep -v '^k8s.io/sample-' | sort -u)
  [[ ${#STAGING[@]} -gt 10 ]] || { log "unexpected staging list: ${STAGING[*]}"; exit 1; }
  {
    echo "module kcover.local/build/k8s"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes v${K8S_VERSION}"
    echo
    echo "replace ("
    for m in "${STAGING[@]}"; do echo "	$m => $m ${STAGING_VERSION}"; done
    echo ")"
  } > go.mod
  step_done
  BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  MAJOR="${K8S_VERSION%%.*}"
  MINOR="${K8S_VERSION#*.}"; MINOR="${MINOR%%.*}"
  LDF="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDF+=" -X $p.gitVersion=v${K8S_VERSION} -X $p.gitMajor=${MAJOR} -X $p.gitMinor=${MINOR}"
    LDF+=" -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.gitTreeState=clean -X $p.buildDate=${BUILD_DATE}"
  done
  for cmd in kubelet kube-proxy; do
    [[ -x "$OUT/$cmd" ]] && continue
    step "kubernetes v${K8S_VERSION}: go build k8s.io/kubernetes/cmd/$cmd"
    "${NICE[@]}" go build -trimpath -tags "providerless" -ldflags "$LDF" -o "$OUT/$cmd.partial" "k8s.io/kubernetes/cmd/$cmd" >&2
    mv "$OUT/$cmd.partial" "$OUT/$cmd"
    step_done
  done
fi

JOBSET_DIR="$(cd "$WORK/jobset" && go mod download -json "sigs.k8s.io/jobset@v${JOBSET_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
cp "$JOBSET_DIR"/config/components/crd/bases/jobset.x-k8s.io_*.yaml "$OUT/crds/"
cp "$JOBSET_DIR/config/components/webhook/manifests.yaml" "$OUT/webhooks/manifests.yaml"
cp "$JOBSET_DIR/config/components/webhook/patches/mutating-patch.yaml" "$OUT/webhooks/mutating-patch.yaml"
cp "$JOBSET_DIR/config/components/webhook/patches/validating-patch.yaml" "$OUT/webhooks/validating-patch.yaml"
chmod u+w "$OUT"/crds/*.yaml "$OUT"/webhooks/*.yaml

cat > "$OUT/versions.env" <<ENV
K8S_VERSION=${K8S_VERSION}
JOBSET_VERSION=${JOBSET_VERSION}
GO_VERSION=$(go env GOVERSION)
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ENV
"$OUT/kubelet" --version >&2
rm -rf "$BIN_DIR"
mv "$OUT" "$BIN_DIR"
rm -rf "$WORK"
log "total build time $((SECONDS - total_start))s"
echo "$BIN_DIR"
