"""Test helpers for Recovery resources: find a real kubectl, run `kubectl get recoveries`, split its table.

`kubectl()` is $KCOVER_KUBECTL, a `kubectl` on PATH, or the one tests/controlplane/build-cluster.sh
cached under ~/.cache/kcover/cluster/*/; None when there is none (the tests then read the same through
the API). `split()` cuts kubectl's aligned output at the header's column starts, so empty cells stay.
"""

from __future__ import annotations

import asyncio
import glob
import os
import re
import shutil
import subprocess
from pathlib import Path


def kubectl() -> str | None:
    env = os.environ.get("KCOVER_KUBECTL")
    if env and Path(env).is_file():
        return env
    found = shutil.which("kubectl")
    if found:
        return found
    cache = os.environ.get("KCOVER_CACHE", str(Path.home() / ".cache" / "kcover"))
    cached = sorted(glob.glob(os.path.join(cache, "cluster", "*", "kubectl")))
    return cached[-1] if cached else None


def split(text: str) -> list[list[str]]:
    """kubectl's table as rows of cells (the header first), cut where the header's columns start."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    rows = []
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(cells)
    return rows


async def kubectl_get(kubeconfig: str, namespace: str | None, *extra: str) -> list[list[str]] | None:
    """`kubectl get recoveries` in `namespace` (None: -A) split into cells, or None without a kubectl."""
    binary = kubectl()
    if binary is None:
        return None
    scope = ["-A"] if namespace is None else ["-n", namespace]
    done = await asyncio.to_thread(subprocess.run, [binary, "--kubeconfig", kubeconfig, "get", "recoveries",
                                                    *scope, *extra], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return split(done.stdout)
