"""SIGTERM to a real `kcover controller` process whose plugin ignores stop: it exits, and the Lease is released.

The plugin is installed the way a user installs one: a distribution (a `.dist-info` with an entry point in
`kcover.detectors`) on the process's path. Its `run()` blocks in a synchronous wait forever (isolated, in
a thread), or, inline, swallows every cancellation, so that only a forced exit ends the process: the
shutdown deadline, or a second SIGTERM. The tests assert what a user sees — the process ended with
status 0 and the Lease has no holder, so a successor takes over at once — and print how long the exit
took (a figure, not an assertion).
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


class Clinging(Stubborn):
    async def run(self, bus, stop):
        while True:  # ignores stop, and swallows every cancellation: the loop runs, the task never ends
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass
'''


def install_plugin(root: Path) -> None:
    (root / "kcover_stubborn_plugin.py").write_text(PLUGIN)
    info = root / "kcover_stubborn_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kcover-stubborn-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kcover.detectors]\nstubborn = kcover_stubborn_plugin:Stubborn\n"
                                           "clinging = kcover_stubborn_plugin:Clinging\n")


def lease_of(srv: simserver.SimServer) -> dict[str, object]:
    for lease in srv.store.iter_objects("leases.coordination.k8s.io"):
        if lease["metadata"]["name"] == "kcover-controller":
            return dict(lease["spec"])
    return {}


async def _stop_leader(tmp_path: Path, plugin: str, *, signals: int, grace: float = 5.0) -> tuple[int, float, str,
                                                                                                 dict[str, object]]:
    """Start a controller with `plugin` enabled, wait until it leads, send it `signals` SIGTERMs (one second apart);
    (exit code, seconds from the first signal to the exit, stderr, the Lease's spec afterwards)."""
    install_plugin(tmp_path)
    async with simserver.SimServer() as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kcover.cli", "controller", "--kubeconfig", str(kubeconfig), "--port", "0",
            "--identity", "replica-a",
            "--set", f"detectors.entries.{plugin}={{}}", "--set", "kube.workload_kinds=[]",
            "--set", f"detectors.entries.{plugin}.isolated={'true' if plugin == 'stubborn' else 'false'}",
            "--set", "detectors.stop_grace_seconds=1", "--set", f"server.shutdown_grace_seconds={grace:g}",
            "--set", "lease.lease_duration_seconds=60", "--set", "lease.renew_deadline_seconds=40",
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        seen: list[bytes] = []
        try:
            assert proc.stderr is not None
            async with asyncio.timeout(30):  # until the detectors, the plugin among them, start
                while not any(b'"detectors_starting"' in line for line in seen):
                    line = await proc.stderr.readline()
                    if not line:
                        pytest.fail(f"the controller exited before its detectors started: {b''.join(seen)[-2000:]!r}")
                    seen.append(line)
                while lease_of(srv).get("holderIdentity") != "replica-a":  # noqa: ASYNC110  (polling the store)
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the plugin's run() has been entered
            started = time.monotonic()
            for i in range(signals):
                if i:
                    await asyncio.sleep(1.0)
                proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):  # a bound for the test only; the figure is printed
                code = await proc.wait()
            took = time.monotonic() - started
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stderr = (b"".join(seen) + (await proc.stderr.read() if proc.stderr else b"")).decode()
        return code, took, stderr, lease_of(srv)


async def test_sigterm_with_a_plugin_that_ignores_stop_exits_and_releases_the_lease(tmp_path: Path) -> None:
    code, took, stderr, spec = await _stop_leader(tmp_path, "stubborn", signals=1)
    print(f"exit after SIGTERM: {took:.2f} s (grace: detectors 1 s, process 5 s)")
    assert code == 0, stderr[-2000:]
    assert spec.get("holderIdentity") in ("", None), f"the Lease was released: {spec}"


async def test_the_shutdown_deadline_releases_the_lease_before_it_ends_the_process(tmp_path: Path) -> None:
    """An inline plugin that swallows its cancellation keeps the controller from ever stopping: the exit guard
    ends the process at the deadline, and releases the Lease first (held for 60 s otherwise)."""
    code, took, stderr, spec = await _stop_leader(tmp_path, "clinging", signals=1, grace=2.0)
    print(f"forced exit at the deadline: {took:.2f} s (grace 2 s + margin 5 s)")
    assert "shutdown_forced" in stderr, stderr[-2000:]
    assert code == 0, stderr[-2000:]
    assert spec.get("holderIdentity") in ("", None), f"the Lease was released: {spec}"


async def test_a_second_sigterm_ends_the_process_at_once_and_releases_the_lease(tmp_path: Path) -> None:
    code, took, stderr, spec = await _stop_leader(tmp_path, "clinging", signals=2, grace=20.0)
    print(f"forced exit on the second SIGTERM: {took:.2f} s (grace 20 s)")
    assert "second_signal" in stderr, stderr[-2000:]
    assert took < 20.0, "it did not wait for the shutdown grace"
    assert code == 0, stderr[-2000:]
    assert spec.get("holderIdentity") in ("", None), f"the Lease was released: {spec}"
