"""Helpers shared by the chart tests: paths, `run_helm`, the representative values, `find`."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kcover"
CONTROLPLANE = ROOT / "tests" / "controlplane"
RELEASE = "kcover"
REGISTRY = "registry.example.com/ml"
"""The registry every render gives `image.registry` (it has no default) unless a test says otherwise."""


def _target_kube_version() -> str:
    """The Kubernetes version the real control plane is built at (tests/controlplane/build.sh's pin)."""
    build = CONTROLPLANE / "build.sh"
    text = build.read_text(encoding="utf-8") if build.exists() else ""
    match = re.search(r'K8S_VERSION="\$\{KCOVER_K8S_VERSION:-([0-9.]+)\}"', text)
    return os.environ.get("KCOVER_K8S_VERSION") or (match.group(1) if match else "1.36.0")


# helm built from its Go module reports Kubernetes v1.20 unless told: render for the version tested.
KUBE_VERSION = _target_kube_version()
NAMESPACE = "kcover-system"

Render = Callable[..., list[dict[str, Any]]]


def cache_dir() -> Path:
    return Path(os.environ.get("KCOVER_CACHE", str(Path.home() / ".cache" / "kcover")))


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def _registry_values() -> str:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kcover-chart-registry-{os.getpid()}.json"
    if not path.exists():
        path.write_text(json.dumps({"image": {"registry": REGISTRY}}))
    return str(path)


def run_helm(helm: str, *args: str, values: dict[str, Any] | None = None,
             check: bool = True, registry: bool = True) -> subprocess.CompletedProcess[str]:
    """helm with `values` on stdin; with `registry` (for commands that render), `image.registry` set first
    (REGISTRY), so `values` can still override it."""
    cmd = [helm, *args]
    if registry and args and args[0] in ("template", "lint", "install", "upgrade"):
        cmd += ["--values", _registry_values()]
    if values is not None:
        cmd += ["--values", "-"]
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/kcover-helm-cache", "HELM_CONFIG_HOME": "/tmp/kcover-helm-config",
           "HELM_DATA_HOME": "/tmp/kcover-helm-data"}
    proc = subprocess.run(cmd, input=json.dumps(values) if values is not None else None, capture_output=True,
                          text=True, env=env, check=False, timeout=120)
    if check:
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return proc


# Representative values: each turns on one feature an operator would.
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "dry-run": {"dryRun": True},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "pvc": {"controller": {"logs": {"persistence": {"enabled": True, "size": "20Gi",
                                                    "accessModes": ["ReadWriteMany"],
                                                    "storageClassName": "nfs"}}}},
    "plugins": {
        "detectors": {"logscan": {"enabled": True, "config": {"tail_lines": 200}},
                      "dcgm": {"config": {"exporter_interval_seconds": 30}},
                      "pod-status": {"config": {"exit_codes": [137]}}},
        "config": {"recovery": {"workload_cooldown_seconds": 120},
                   "detectors": {"entries": {"nvml": {"config": {"health_interval_seconds": 5}}}}},
        "agent": {"dcgmExporterUrl": "http://nvidia-dcgm-exporter.gpu-operator.svc:9400/metrics"},
        "xidPolicy": {"xids": {"79": {"class": "hardware", "severity": "Error", "action": "cordon-node"}}},
    },
    "preflight": {"preflight": {"enabled": True, "collectionTimeoutSeconds": 900},
                  "detectors": {"preflight": {"config": {"relative_fraction": 0.6}}}},
    "node-selector": {
        # null drops the chart's default GPU label: Helm merges maps, it does not replace them
        "agent": {"nodeSelector": {"gpu.example.com/class": "h100", "nvidia.com/gpu.present": None},
                  "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                      "nodeSelectorTerms": [{"matchExpressions": [
                          {"key": "gpu.example.com/pool", "operator": "In", "values": ["training"]}]}]}}},
                  "runtimeClassName": ""},
        "controller": {"nodeSelector": {"kubernetes.io/os": "linux"}, "replicas": 3},
    },
    "names-and-extras": {
        "nameOverride": "gpu-guard", "fullnameOverride": "fleet-kcover", "commonLabels": {"team": "ml-infra"},
        "controller": {"podLabels": {"tier": "control"}, "podAnnotations": {"prometheus.io/scrape": True},
                       "extraVolumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
                       "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True}]},
        "agent": {"nodeSelector": {"gpu": True}, "priorityClassName": "gpu-agents",
                  "extraVolumes": [{"name": "dcgm", "hostPath": {"path": "/usr/bin/dcgmi", "type": "File"}}],
                  "extraVolumeMounts": [{"name": "dcgm", "mountPath": "/usr/local/bin/dcgmi", "readOnly": True}]},
    },
    "logs-retention": {"controller": {"logs": {"emptyDirSizeLimit": "2Gi"}},
                       "config": {"recovery": {"save_logs": {"retention_bytes": 1_500_000_000}}}},
}


def find(objs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(hits) == 1, f"expected one {kind} *{name_suffix}, found {[o['metadata']['name'] for o in hits]}"
    return hits[0]


def controlplane_available() -> bool:
    env = os.environ.get("KCOVER_CONTROLPLANE_BIN")
    if env and (Path(env) / "kube-apiserver").is_file():
        return True
    return bool(glob.glob(str(cache_dir() / "controlplane" / "k8s-*" / "kube-apiserver")))


