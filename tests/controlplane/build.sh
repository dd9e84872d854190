#!/usr/bin/env bash
# Build pinned, real control-plane binaries (kube-apiserver + etcd) for kcover's
# integration tests from their Go modules, using the installed Go toolchain.
#
# Output: ${KCOVER_CACHE:-$HOME/.cache/kcover}/controlplane/k8s-<ver>-etcd-<ver>/{kube-apiserver,etcd,versions.env}
# The last line printed on stdout is always the bin dir.
#
# Env overrides:
#   KCOVER_CONTROLPLANE_BIN  use this dir if it holds both binaries (no build)
#   KCOVER_K8S_VERSION       Kubernetes version (default pinned below; the test matrix's older
#                            version is KCOVER_K8S_VERSION=1.29.6)
#   KCOVER_ETCD_VERSION      etcd version (default: pinned per Kubernetes minor below)
#   KCOVER_CACHE             cache root
set -euo pipefail

# Pinned Kubernetes version: the newest patch release served by the Go module proxy when this was written.
K8S_VERSION="${KCOVER_K8S_VERSION:-1.36.3}"
# etcd per Kubernetes minor: the version each pinned patch release names in its build/dependencies.yaml
# (what upstream tested it with, and what kubeadm installs beside it), read from the k8s.io/kubernetes
# module of that patch: v1.29.6 -> 3.5.12, v1.30.14 -> 3.5.15, v1.31.14 / v1.32.13 / v1.33.13 -> 3.5.24.
# 1.36 keeps 3.6.16, a newer patch of the 3.6 minor that v1.36.3 names (3.6.8). A patch release other than
# the one named here gets its minor's etcd; the build warns when the module names another one.
etcd_for_minor() {
  case "$1" in
    1.29) echo 3.5.12 ;;
    1.30) echo 3.5.15 ;;
    1.31|1.32|1.33) echo 3.5.24 ;;
    1.34) echo 3.6.4 ;;
    1.35) echo 3.6.6 ;;
    1.36) echo 3.6.16 ;;
    *) return 1 ;;
  esac
}
K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f1,2)"
if [[ -n "${KCOVER_ETCD_VERSION:-}" ]]; then
  ETCD_VERSION="$KCOVER_ETCD_VERSION"
elif ! ETCD_VERSION="$(etcd_for_minor "$K8S_MINOR")"; then
  echo "[build.sh] no etcd pinned for Kubernetes ${K8S_MINOR}; set KCOVER_ETCD_VERSION" >&2
  exit 2
fi

log() { echo "[build.sh] $*" >&2; }

if [[ -n "${KCOVER_CONTROLPLANE_BIN:-}" ]]; then
  if [[ -x "$KCOVER_CONTROLPLANE_BIN/kube-apiserver" && -x "$KCOVER_CONTROLPLANE_BIN/etcd" ]]; then
    log "using KCOVER_CONTROLPLANE_BIN"
    echo "$KCOVER_CONTROLPLANE_BIN"
    exit 0
  fi
  log "KCOVER_CONTROLPLANE_BIN=$KCOVER_CONTROLPLANE_BIN lacks kube-apiserver/etcd; building instead"
fi

CACHE_ROOT="${KCOVER_CACHE:-$HOME/.cache/kcover}/controlplane"
BIN_DIR="$CACHE_ROOT/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}"

have_bins() { [[ -x "$BIN_DIR/kube-apiserver" && -x "$BIN_DIR/etcd" && -f "$BIN_DIR/versions.env" ]]; }

if have_bins; then
  log "reused $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed"; exit 1; }
mkdir -p "$CACHE_ROOT"

# Serialise concurrent builds (parallel test workers).
exec 9>"$CACHE_ROOT/.build.lock"
if command -v flock >/dev/null; then
  flock 9
  if have_bins; then
    log "reused $BIN_DIR (built by a concurrent run)"
    echo "$BIN_DIR"
    exit 0
  fi
fi

export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off
export GOMODCACHE="${GOMODCACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/go-mod}"  # the module cache with the build cache, under ~/.cache
NICE=(nice -n 10)
STAGING_VERSION="v0.${K8S_VERSION#1.}"   # 1.36.3 -> v0.36.3

WORK="$CACHE_ROOT/build-k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}"
OUT="$WORK/out"
# A build that stopped part-way keeps what it finished: each binary is built to a temporary name and
# renamed when complete, so a rerun starts at the first missing one (the Go build cache keeps the rest).
mkdir -p "$WORK/k8s" "$WORK/etcd" "$OUT"

BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
step_start=0
step() { step_start=$SECONDS; log "==> $*"; }
step_done() { log "    done in $((SECONDS - step_start))s"; }
total_start=$SECONDS

# ---------------------------------------------------------------- etcd
if [[ ! -x "$OUT/etcd" ]]; then
step "etcd v${ETCD_VERSION}: resolve modules"
cd "$WORK/etcd"
cat > go.mod <<MOD
module kcover.local/build/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 v${ETCD_VERSION}

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 v${ETCD_VERSION}
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 v${ETCD_VERSION}
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 v${ETCD_VERSION}
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 v${ETCD_VERSION}
)
MOD
go mod download go.etcd.io/etcd/server/v3 >&2
step_done

step "etcd v${ETCD_VERSION}: go build"
# go.etcd.io/etcd/server/v3 (server/main.go) is etcd's `package main`.
"${NICE[@]}" go build -trimpath \
  -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v${ETCD_VERSION}" \
  -o "$OUT/etcd.partial" go.etcd.io/etcd/server/v3 >&2
mv "$OUT/etcd.partial" "$OUT/etcd"
step_done
fi

# ---------------------------------------------------------------- kube-apiserver
if [[ ! -x "$OUT/kube-apiserver" ]]; then
step "kubernetes v${K8S_VERSION}: resolve modules"
cd "$WORK/k8s"
K8S_GOMOD="$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
[[ -f "$K8S_GOMOD" ]] || { log "could not download k8s.io/kubernetes@v${K8S_VERSION} go.mod"; exit 1; }
K8S_DIR="$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
NAMED_ETCD="$(grep -A1 'name: "etcd"$' "$K8S_DIR/build/dependencies.yaml" 2>/dev/null | sed -n 's/^[[:space:]]*version: //p' || true)"
if [[ -n "$NAMED_ETCD" && "$NAMED_ETCD" != "$ETCD_VERSION" ]]; then
  log "    note: k8s.io/kubernetes v${K8S_VERSION} names etcd ${NAMED_ETCD}; building etcd ${ETCD_VERSION}"
fi
# Every `k8s.io/x => ./staging/src/k8s.io/x` replace in k8s.io/kubernetes' go.mod gets pinned to the
# published staging version. sample-* modules are not published for every release and not needed.
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
log "    pinned ${#STAGING[@]} staging modules to ${STAGING_VERSION}"
step_done

step "kubernetes v${K8S_VERSION}: go build k8s.io/kubernetes/cmd/kube-apiserver"
MAJOR="${K8S_VERSION%%.*}"
MINOR="${K8S_VERSION#*.}"; MINOR="${MINOR%%.*}"
VPKG=k8s.io/component-base/version
CPKG=k8s.io/client-go/pkg/version
LDF="-s -w"
for p in "$VPKG" "$CPKG"; do
  LDF+=" -X $p.gitVersion=v${K8S_VERSION} -X $p.gitMajor=${MAJOR} -X $p.gitMinor=${MINOR}"
  LDF+=" -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.gitTreeState=clean -X $p.buildDate=${BUILD_DATE}"
done
"${NICE[@]}" go build -trimpath -tags "providerless" -ldflags "$LDF" \
  -o "$OUT/kube-apiserver.partial" k8s.io/kubernetes/cmd/kube-apiserver >&2
mv "$OUT/kube-apiserver.partial" "$OUT/kube-apiserver"
step_done
fi

# ---------------------------------------------------------------- install
cat > "$OUT/versions.env" <<ENV
K8S_VERSION=${K8S_VERSION}
ETCD_VERSION=${ETCD_VERSION}
STAGING_VERSION=${STAGING_VERSION}
GO_VERSION=$(go env GOVERSION)
BUILD_DATE=${BUILD_DATE}
ENV
# No pipe into head here: under pipefail, head closing early sends etcd SIGPIPE and fails the build.
"$OUT/etcd" --version >&2
"$OUT/kube-apiserver" --version >&2
rm -rf "$BIN_DIR"
mv "$OUT" "$BIN_DIR"
rm -rf "$WORK"
log "total build time $((SECONDS - total_start))s"
echo "$BIN_DIR"
