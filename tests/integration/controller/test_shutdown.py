"""SIGTERM to a real `kcover controller` process whose plugin ignores stop: it exits, and the Lease is released.

The plugin is installed the way a user installs one: a distribution (a `.dist-info` with an entry point in
`kcover.detectors`) on the process's path. Its `run()` blocks in a synchronous wait forever. The test
asserts what a user sees — the process ended with status 0 and the Lease has no holder — and prints how
long the exit took (a figure, not an assertion).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from kcover.sim import server as simserver

pytestmark = pytest.mark.sim_only("starts a controller process against the simulated API server")

PLUGIN = '''
import asyncio, threading
from typing import ClassVar
from pydantic import BaseModel
from kcover.detectors import contract


class Stubborn:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = contract.EmptyConfig

    def __init__(self, name, config, context):
        pass

    async def run(self, bus, stop):
        threading.Event().wait()  # ignores stop: never returns
'''


def install_plugin(root: Path) -> None:
    (root / "kcover_stubborn_plugin.py").write_text(PLUGIN)
    info = root / "kcover_stubborn_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kcover-stubborn-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kcover.detectors]\nstubborn = kcover_stubborn_plugin:Stubborn\n")


def lease_of(srv: simserver.SimServer) -> dict[str, object]:
    for lease in srv.store.iter_objects("leases.coordination.k8s.io"):
        if lease["metadata"]["name"] == "kcover-controller":
            return dict(lease["spec"])
    return {}


async def test_sigterm_with_a_plugin_that_ignores_stop_exits_and_releases_the_lease(tmp_path: Path) -> None:
    install_plugin(tmp_path)
    async with simserver.SimServer() as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kcover.cli", "controller", "--kubeconfig", str(kubeconfig), "--port", "0",
            "--identity", "replica-a",
            "--set", "detectors.entries.stubborn={}", "--set", "kube.workload_kinds=[]",
            "--set", "detectors.stop_grace_seconds=1", "--set", "server.shutdown_grace_seconds=5",
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(30):
                while lease_of(srv).get("holderIdentity") != "replica-a":
                    if proc.returncode is not None:
                        err = (await proc.stderr.read()).decode() if proc.stderr else ""
                        pytest.fail(f"the controller exited before it led: {err[-2000:]}")
                    await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # the detectors, the plugin's thread among them, are running
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):  # a bound for the test only; the figure is printed
                code = await proc.wait()
            took = time.monotonic() - started
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stderr = (await proc.stderr.read()).decode() if proc.stderr else ""
        print(f"exit after SIGTERM: {took:.2f} s (grace: detectors 1 s, process 5 s)")
        assert code == 0, stderr[-2000:]
        spec = lease_of(srv)
        assert spec.get("holderIdentity") in ("", None), f"the Lease was released: {spec}"
