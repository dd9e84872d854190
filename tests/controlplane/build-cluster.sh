#!/usr/bin/env bash
# Build the pinned components of the `cluster` test backend from their Go modules, with the installed
# Go toolchain: kube-controller-manager, kube-scheduler and kubectl (from the same k8s.io/kubernetes
# version as tests/controlplane/build.sh's kube-apiserver), kwok, and the Kubeflow training operator
# with its CRDs (copied from the operator's module source, not downloaded separately).
#
# Output: ${KCOVER_CACHE:-$HOME/.cache/kcover}/cluster/k8s-<ver>-kwok-<ver>-kto-<ver>/
#           {kube-controller-manager,kube-scheduler,kubectl,kwok,training-operator,crds/*.yaml,stages/*.yaml,
#            versions.env}
# The last line printed on stdout is always that directory.
#
# Env overrides:
#   KCOVER_CLUSTER_BIN   use this dir if it holds every component (no build)
#   KCOVER_K8S_VERSION   Kubernetes version (default: build.sh's pin)
#   KCOVER_KWOK_VERSION, KCOVER_KTO_VERSION
#   KCOVER_CACHE         cache root
set -euo pipefail

K8S_VERSION="${KCOVER_K8S_VERSION:-1.36.3}"
KWOK_VERSION="${KCOVER_KWOK_VERSION:-0.8.0}"
KTO_VERSION="${KCOVER_KTO_VERSION:-1.8.1}"
COMPONENTS=(kube-controller-manager kube-scheduler kubectl kwok training-operator)

log() { echo "[build-cluster.sh] $*" >&2; }

complete() {
  local d=$1 c
  for c in "${COMPONENTS[@]}"; do [[ -x "$d/$c" ]] || return 1; done
  [[ -f "$d/versions.env" ]] && compgen -G "$d/crds/*.yaml" >/dev/null && compgen -G "$d/stages/*.yaml" >/dev/null
}

if [[ -n "${KCOVER_CLUSTER_BIN:-}" ]]; then
  if complete "$KCOVER_CLUSTER_BIN"; then
    log "using KCOVER_CLUSTER_BIN"
    echo "$KCOVER_CLUSTER_BIN"
    exit 0
  fi
  log "KCOVER_CLUSTER_BIN=$KCOVER_CLUSTER_BIN is incomplete; building instead"
fi

CACHE_ROOT="${KCOVER_CACHE:-$HOME/.cache/kcover}/cluster"
BIN_DIR="$CACHE_ROOT/k8s-${K8S_VERSION}-kwok-${KWOK_VERSION}-kto-${KTO_VERSION}"

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
mkdir -p "$WORK/k8s" "$OUT/crds"
# A rerun keeps the components an interrupted run already built (the loop below skips them).
total_start=$SECONDS
step_start=0
step() { step_start=$SECONDS; log "==> $*"; }
step_done() { log "    done in $((SECONDS - step_start))s"; }

# ---------------------------------------------------------------- kubernetes components
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
for cmd in kube-controller-manager kube-scheduler kubectl; do
  [[ -x "$OUT/$cmd" ]] && continue
  step "kubernetes v${K8S_VERSION}: go build k8s.io/kubernetes/cmd/$cmd"
  "${NICE[@]}" go build -trimpath -tags "providerless" -ldflags "$LDF" -o "$OUT/$cmd.partial" "k8s.io/kubernetes/cmd/$cmd" >&2
  mv "$OUT/$cmd.partial" "$OUT/$cmd"
  step_done
done

# ---------------------------------------------------------------- kwok
step "kwok v${KWOK_VERSION}: go install"
GOBIN="$OUT" "${NICE[@]}" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v${KWOK_VERSION}" >&2
# kwok's own Stage documents (pod and node lifecycle, chaos), to compose the backend's kwok config from.
KWOK_DIR="$(go mod download -json "sigs.k8s.io/kwok@v${KWOK_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
mkdir -p "$OUT/stages"
for f in pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete node/fast/node-initialize \
         node/heartbeat-with-lease/node-heartbeat-with-lease node/chaos/node-not-ready \
         pod/chaos/pod-container-running-failed; do
  cp "$KWOK_DIR/kustomize/stage/$f.yaml" "$OUT/stages/$(basename "$f").yaml"
done
chmod u+w "$OUT"/stages/*.yaml
step_done

# ---------------------------------------------------------------- Kubeflow training operator (+ its CRDs)
step "training-operator v${KTO_VERSION}: go install"
GOBIN="$WORK/kto" "${NICE[@]}" go install -trimpath -ldflags "-s -w" \
  "github.com/kubeflow/training-operator/cmd/training-operator.v1@v${KTO_VERSION}" >&2
mv "$WORK/kto/training-operator.v1" "$OUT/training-operator"
KTO_DIR="$(go mod download -json "github.com/kubeflow/training-operator@v${KTO_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$KTO_DIR/manifests/base/crds" ]] || { log "no manifests/base/crds in $KTO_DIR"; exit 1; }
cp "$KTO_DIR"/manifests/base/crds/kubeflow.org_*.yaml "$OUT/crds/"
chmod u+w "$OUT"/crds/*.yaml
step_done

cat > "$OUT/versions.env" <<ENV
K8S_VERSION=${K8S_VERSION}
KWOK_VERSION=${KWOK_VERSION}
KTO_VERSION=${KTO_VERSION}
GO_VERSION=$(go env GOVERSION)
BUILD_DATE=${BUILD_DATE}
ENV
rm -rf "$BIN_DIR"
mv "$OUT" "$BIN_DIR"
rm -rf "$WORK"
log "total build time $((SECONDS - total_start))s"
echo "$BIN_DIR"
