"""Roles import what they run: `kcover controller` and `kcover agent` load neither the simulated cluster
nor the bench, neither role loads the other's package, neither loads kubernetes-asyncio or grpc, nor a
detector plugin that its configuration does not enable.

Each role is started as the `kcover` command starts it (`kcover.cli.main`), in a fresh interpreter, with a
kubeconfig naming a server that does not answer: it reads its settings, starts its health server, imports its
package and builds itself, retrying the API server. Once its package is loaded (and a moment more), what the
interpreter holds is what the role's start-up imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import json, os, sys, threading, time
from kcover import cli

def report():
    print(json.dumps(sorted(m for m in sys.modules
                            if m.split(".")[0] in ("kcover", "kubernetes_asyncio", "grpc") or m.startswith("kcover_"))),
          flush=True)
    os._exit(0)

def when_started():
    deadline = time.monotonic() + 50
    while time.monotonic() < deadline and not any(m.endswith(".running") and m.startswith(("kcover.controller",
                                                                                            "kcover.agent"))
                                                  for m in list(sys.modules)):
        time.sleep(0.05)
    time.sleep(1.0)  # the role builds itself and starts
    report()

threading.Thread(target=when_started, daemon=True).start()
try:
    cli.main(sys.argv[1:])
finally:
    report()
"""


def _modules_after(tmp_path: Path, *argv: str) -> list[str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    done = subprocess.run([sys.executable, "-c", SCRIPT, *argv, "--kubeconfig", str(kubeconfig),
                           "--config", "/dev/null", "--port", "0", "--log-level", "error"],
                          capture_output=True, text=True, timeout=90, check=True)
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return modules


@pytest.mark.parametrize(("role", "extra", "other"), [
    ("controller", (), "kcover.agent"),
    ("agent", ("--node-name", "node-1"), "kcover.controller"),
])
def test_a_role_imports_neither_the_sim_nor_the_bench_nor_the_other_role(tmp_path: Path, role: str,
                                                                          extra: tuple[str, ...], other: str) -> None:
    modules = _modules_after(tmp_path, role, *extra)
    assert f"kcover.{role}.running" in modules  # the role really started
    assert [m for m in modules if m.startswith(("kcover.sim", "kcover.bench", other))] == []
    # nor what only some users need: kubernetes-asyncio (exec/auth-provider kubeconfigs), grpc (the
    # kubelet's PodResources, asked on a GPU's first fault)
    assert [m for m in modules if m.split(".")[0] in ("kubernetes_asyncio", "grpc")] == []
    # nor the installed detector plugins its configuration does not enable (discovery imports only those asked for)
    assert [m for m in modules if m.startswith("kcover_")] == []


def test_the_cli_module_imports_no_command_module() -> None:
    done = subprocess.run([sys.executable, "-c", "import json, sys, kcover.cli; "
                           "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kcover.'))))"],
                          capture_output=True, text=True, timeout=60, check=True)
    modules = json.loads(done.stdout)
    assert [m for m in modules if m.startswith(("kcover.sim", "kcover.bench", "kcover.controller", "kcover.agent",
                                                "kcover.status"))] == []
