"""A role's process is not ready before the role is: real `kcover controller` and `kcover agent` processes.

The health server starts first, so the kubelet's probes get an answer at once; until the role's own checks
exist (the controller's `cache` and `detectors`, the agent's `detectors`) its /readyz must fail on `role`.
Ready earlier, a rolling update of the controller Deployment would take the old leader away while the new
replica's cache still lists (a failover that waits for a whole sync), and a DaemonSet update would move
on to the next node's agent before this one runs. /readyz is polled from the first moment the port
answers, and every 200 must carry the role's own checks. Real time; every backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from harness import ports

ROOT = Path(__file__).resolve().parents[3]
Cluster = Any  # tests/backends.py's Cluster


async def _answers(port: int, own: tuple[str, ...], proc: asyncio.subprocess.Process, *,
                   within: float = 90.0) -> list[tuple[int, str]]:
    """Every /readyz answer from the first until one is 200 with all of `own` passing."""
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline and proc.returncode is None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"http://127.0.0.1:{port}/readyz",
                                       timeout=aiohttp.ClientTimeout(total=5)) as r:
                    seen.append((r.status, await r.text()))
                    if r.status == 200 and all(f"[+] {check} " in seen[-1][1] for check in own):
                        return seen
            await asyncio.sleep(0.005)
    raise AssertionError(f"the process never got ready with {own} (exit {proc.returncode}); last: {seen[-1:]}")


async def _run(argv: list[str], tmp_path: Path, own: tuple[str, ...]) -> list[tuple[int, str]]:
    """The role started on port 0 (`argv` says so); its answers from the port it logged it bound."""
    log = (tmp_path / "role.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kcover.cli", *argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, env={**os.environ, "KCOVER_LOGGING__FORMAT": "json"})
    try:
        return await _answers(await ports.wait_bound_port(tmp_path / "role.log", proc), own, proc)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


def _early(answers: list[tuple[int, str]], own: tuple[str, ...]) -> list[str]:
    """The 200 answers given before the role's own checks were there."""
    return [text for status, text in answers if status == 200 and not all(f" {check} " in text for check in own)]


async def test_the_controller_is_not_ready_before_its_cache_and_detectors_exist(cluster: Cluster,
                                                                                tmp_path: Path) -> None:
    ns = cluster.namespace
    sets = [f"recovery.ledger_namespace={ns}", f"lease.namespace={ns}", "kube.gc_freeze_after_sync=false",
            "detectors.entries.nvml.enabled=false", "detectors.entries.dcgm.enabled=false"]
    (tmp_path / "config.yaml").write_text("{}\n")
    own = ("cache", "detectors")
    answers = await _run(["controller", "--kubeconfig", cluster.kubeconfig_path, "--port", "0",
                          "--identity", "replica-a", "--config", str(tmp_path / "config.yaml"),
                          *[arg for s in sets for arg in ("--set", s)]], tmp_path, own)
    assert not _early(answers, own), f"ready before the controller was: {_early(answers, own)[:1]}"
    starting = [text for status, text in answers if status == 503 and "[-] role " in text]
    assert all("starting" in text for text in starting)


async def test_the_agent_is_not_ready_before_its_detectors_exist(cluster: Cluster, tmp_path: Path) -> None:
    node = f"ready-{os.getpid()}"
    await cluster.client.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                               "metadata": {"name": node}})
    fake = tmp_path / "nvml"
    fake.write_text("")
    config = tmp_path / "agent.yaml"
    config.write_text(f"agent: {{node_name: {node}, event_namespace: {cluster.namespace}, "
                      "pod_resources_socket: /nonexistent/kubelet.sock}\n"
                      "detectors: {entries: {dcgm: {enabled: false}}}\n"
                      "server: {host: 127.0.0.1, port: 0}\n")
    own = ("detectors",)
    answers = await _run(["agent", f"--config={config}", f"--kubeconfig={cluster.kubeconfig_path}",
                          f"--fake-nvml={fake}"], tmp_path, own)
    assert not _early(answers, own), f"ready before the agent was: {_early(answers, own)[:1]}"
