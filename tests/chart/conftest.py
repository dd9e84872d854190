"""Fixtures for the Helm chart tests: a pinned `helm` binary, rendering, and a real kube-apiserver.

`helm` comes from `tests/controlplane/build-helm.sh` (built from its Go module, cached under
`${KCOVER_CACHE:-~/.cache/kcover}/helm-<ver>/`) or `KCOVER_HELM_BIN`. The API server is
`tests/controlplane/server.py`'s `ControlPlane`. Either missing skips its tests with the reason,
unless CI=true, where the binary is built (or the control plane started) and a failure fails the run.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from typing import Any

import pytest
import yaml
from chartkit import (
    CHART,
    CONTROLPLANE,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    Render,
    cache_dir,
    in_ci,
    run_helm,
)


@pytest.fixture(scope="session")
def helm_bin() -> str:
    env = os.environ.get("KCOVER_HELM_BIN")
    if env and os.access(env, os.X_OK):
        return env
    built = sorted(glob.glob(str(cache_dir() / "helm-*" / "helm")))
    if built:
        return built[-1]
    if not in_ci():
        pytest.skip("helm is not built (run tests/controlplane/build-helm.sh or set KCOVER_HELM_BIN); "
                    "CI=true builds it and makes a failure fatal")
    proc = subprocess.run(["bash", str(CONTROLPLANE / "build-helm.sh")], capture_output=True, text=True,
                          check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"build-helm.sh failed:\n{proc.stderr[-4000:]}")
    return lines[-1].strip()


@pytest.fixture(scope="session")
def render(helm_bin: str) -> Render:
    """`render(values)` -> the chart's objects as `helm template` renders them (memoised)."""
    memo: dict[str, list[dict[str, Any]]] = {}

    def _render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        key = json.dumps([values, namespace], sort_keys=True)
        if key not in memo:
            proc = run_helm(helm_bin, "template", RELEASE, str(CHART), "--namespace", namespace,
                            "--kube-version", KUBE_VERSION,
                            values=values or {})
            memo[key] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
        return memo[key]

    return _render


# ------------------------------------------------------------------------------------------ control plane

# `controlplane` (the session's one real control plane) comes from tests/backends.py.
