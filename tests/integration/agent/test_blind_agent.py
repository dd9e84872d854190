"""An agent that cannot see its GPUs says so, on every backend (the simulated server and a real kube-apiserver).

A GPU node (`nvidia.com/gpu` in its capacity) whose agent has no GPU detector that runs (NVML cannot load, no
`dcgmi`: a broken driver rollout or a missing runtime class looks so) gets `KcoverGPUHealthy=Unknown`, reason
`NoGPUDetector`, naming what is missing, as the first and only condition the agent writes there (a watch of the
Node from before the agent started sees every write); the agent stays Ready, says degraded and exports
`kcover_agent_blind 1`. What it must not do is as tested: a GPU node where NVML runs, and a node without GPU
capacity, get `True` and `kcover_agent_blind 0`; a blind node whose driver loads again gets `True`. The real
`kcover agent` process, started without `--fake-nvml` on a machine without an NVIDIA driver, does the same
through the real NVML adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import ports

from kcover import errors, layering, metrics, serving, settings
from kcover.agent import running as agent_running
from kcover.kube import client as client_
from kcover.nvml import backend, fake, real

Cluster = Any  # tests/backends.py's Cluster
CONDITION = "KcoverGPUHealthy"
NO_DCGMI = "/nonexistent/kcover-test/dcgmi"


async def _node(kube: client_.KubeClient, name: str, capacity: dict[str, str],
                labels: dict[str, str] | None = None) -> None:
    await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                      "metadata": {"name": name, "labels": labels or {}}})
    node = await kube.request("GET", f"/api/v1/nodes/{name}")
    node["status"] = {"capacity": capacity, "allocatable": capacity,
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "message": "kubelet is posting ready status"}]}
    await kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node)


GPU_NODE = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
CPU_NODE = {"cpu": "64", "memory": "512Gi", "pods": "110"}


def _settings(ns: str, node: str) -> settings.Settings:
    return layering.layer(file_data={
        "agent": {"node_name": node, "event_namespace": ns, "pod_resources_socket": "/nonexistent/kubelet.sock"},
        "detectors": {"settle_seconds": 0.5, "restart_initial_seconds": 0.2, "restart_max_seconds": 0.5,
                      "entries": {"nvml": {"config": {"wait_timeout_ms": 50, "health_interval_seconds": 0.2}},
                                  "dcgm": {"config": {"dcgmi_path": NO_DCGMI}}}},
    }).settings


@dataclass
class Seen:
    """Every status of the agent's condition the Node went through, from a watch opened before the agent."""

    statuses: list[str] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def until(self, status: str, within: float = 15.0) -> dict[str, Any]:
        async with asyncio.timeout(within):
            while self.last.get("status") != status:
                self.changed.clear()
                await self.changed.wait()
        return self.last


@contextlib.asynccontextmanager
async def _watching(cluster: Cluster, node: str) -> AsyncIterator[Seen]:
    seen = Seen()
    listed = await cluster.client.request("GET", "/api/v1/nodes", query={"fieldSelector": f"metadata.name={node}"})
    rv = listed["metadata"]["resourceVersion"]

    async def watch() -> None:
        query = {"watch": "true", "fieldSelector": f"metadata.name={node}", "resourceVersion": rv}
        async with cluster.new_client() as watcher, \
                watcher.stream("/api/v1/nodes", query=query, read_timeout=60) as resp:
            async for line in resp.content:
                obj = orjson.loads(line)["object"]
                for cond in (obj.get("status") or {}).get("conditions") or []:
                    if cond["type"] == CONDITION and cond != seen.last:
                        if cond["status"] != seen.last.get("status"):
                            seen.statuses.append(cond["status"])
                        seen.last = cond
                        seen.changed.set()

    task = asyncio.create_task(watch(), name="test:watch-node")
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass
class Running:
    agent: agent_running.Agent
    health: serving.Health
    metrics: metrics.Metrics
    started: float

    def blind(self) -> float | None:
        return self.metrics.registry.get_sample_value("kcover_agent_blind", {"node": self.agent.node})


@contextlib.asynccontextmanager
async def _agent(cluster: Cluster, node: str, nvml: fake.FakeNvml) -> AsyncIterator[Running]:
    stop = asyncio.Event()
    health, mets = serving.Health(), metrics.Metrics(role=metrics.AGENT, process=False)
    async with cluster.new_client() as kube:
        agent = agent_running.Agent(_settings(cluster.namespace, node), client=kube, metrics=mets, health=health,
                                    node=node, nvml=nvml, reporter_tick_seconds=0.1)
        started = time.monotonic()
        task = asyncio.create_task(agent.run(stop), name="test:agent")
        try:
            yield Running(agent, health, mets, started)
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


async def test_an_agent_without_nvml_on_a_gpu_node_writes_unknown_and_says_it_is_blind(cluster: Cluster) -> None:
    node = f"blind-{secrets.token_hex(3)}"
    await _node(cluster.client, node, GPU_NODE)
    async with _watching(cluster, node) as seen, \
            _agent(cluster, node, fake.FakeNvml(8, init_error=backend.CODE_LIBRARY_MISSING)) as run:
        cond = await seen.until("Unknown")
        took = time.monotonic() - run.started
        await asyncio.sleep(2.0)  # four retries of both detectors (restart_max_seconds 0.5): nothing flips
        ready, checks = run.health.readiness()
        degraded = run.health.degraded()
        blind = run.blind()
        states = {n: s["state"] for n, s in run.agent.supervisor.describe().items() if n in ("nvml", "dcgm")}
    print(f"blind agent: condition Unknown {took:.2f} s after the agent started ({cluster.backend})")
    assert seen.statuses == ["Unknown"], "the first and only status written: never True, no flip on a retry"
    assert cond["reason"] == "NoGPUDetector"
    assert cond["message"] == ("kcover agent cannot see this node's GPUs: no GPU detector runs (nvml: NVML "
                               "unavailable on this node: fake NVML init failed: library_missing; "
                               f"dcgm: {NO_DCGMI} not found)")
    assert states == {"nvml": "unavailable", "dcgm": "unavailable"}
    assert ready, checks  # Ready: a blind DaemonSet pod must not stall rollouts
    assert degraded["gpu-sight"] == cond["message"]
    assert blind == 1


async def test_a_gpu_node_whose_nvml_runs_and_a_node_without_gpus_get_true(cluster: Cluster) -> None:
    gpu, cpu = f"sees-{secrets.token_hex(3)}", f"cpu-{secrets.token_hex(3)}"
    await _node(cluster.client, gpu, GPU_NODE)
    await _node(cluster.client, cpu, CPU_NODE)
    async with _watching(cluster, gpu) as on_gpu, _watching(cluster, cpu) as on_cpu, \
            _agent(cluster, gpu, fake.FakeNvml(8)) as sees, \
            _agent(cluster, cpu, fake.FakeNvml(8, init_error=backend.CODE_LIBRARY_MISSING)) as cpu_only:
        cond = await on_gpu.until("True")
        await on_cpu.until("True")
        await asyncio.sleep(1.0)
        blind = (sees.blind(), cpu_only.blind())
        degraded = (sees.health.degraded(), cpu_only.health.degraded())
    assert on_gpu.statuses == ["True"]
    assert on_cpu.statuses == ["True"]  # no GPU capacity: not a GPU node, judged as before
    assert cond["reason"] == "GPUsHealthy"
    assert blind == (0, 0)
    assert degraded == ({}, {})


async def test_a_node_labelled_with_gpus_but_without_their_capacity_gets_unknown_from_an_agent_without_nvml(
        cluster: Cluster) -> None:
    """Seen on a real kubelet: the chart's agent runs on `nvidia.com/gpu.present=true` nodes; on one whose GPUs
    were never published (no driver, no device plugin) an agent without NVML and `dcgmi` wrote `True`."""
    node = f"labelled-{secrets.token_hex(3)}"
    await _node(cluster.client, node, CPU_NODE, labels={"nvidia.com/gpu.present": "true"})
    async with _watching(cluster, node) as seen, \
            _agent(cluster, node, fake.FakeNvml(8, init_error=backend.CODE_LIBRARY_MISSING)) as run:
        cond = await seen.until("Unknown")
        await asyncio.sleep(1.0)  # retries of both detectors: nothing flips
        blind = run.blind()
    assert seen.statuses == ["Unknown"]
    assert cond["reason"] == "NoGPUDetector"
    assert blind == 1


async def test_a_blind_node_whose_driver_loads_again_gets_true(cluster: Cluster) -> None:
    node = f"fixed-{secrets.token_hex(3)}"
    await _node(cluster.client, node, GPU_NODE)
    nvml = fake.FakeNvml(8, init_error=backend.CODE_LIBRARY_MISSING)
    async with _watching(cluster, node) as seen, _agent(cluster, node, nvml) as run:
        await seen.until("Unknown")
        nvml.init_error = ""  # the driver rollout fixed: the next retry of the NVML detector runs
        cond = await seen.until("True")
        blind = run.blind()
        degraded = run.health.degraded()
    assert seen.statuses == ["Unknown", "True"]
    assert cond["reason"] == "GPUsHealthy"
    assert (blind, degraded) == (0, {})


def _nvml_loads_here() -> bool:
    try:
        real.RealNvml().init()
    except errors.NvmlError:
        return False
    return True


async def test_the_real_agent_process_without_nvml_or_dcgmi_is_blind(cluster: Cluster, tmp_path: Path) -> None:
    """`kcover agent` as the DaemonSet runs it, without `--fake-nvml`: the real NVML adapter finds no driver."""
    if await asyncio.to_thread(_nvml_loads_here):
        pytest.skip("this machine has an NVIDIA driver: NVML loads, the agent is not blind")
    node = f"blind-proc-{secrets.token_hex(3)}"
    await _node(cluster.client, node, GPU_NODE)
    config = tmp_path / "config.yaml"
    config.write_text(f"""
agent: {{node_name: {node}, event_namespace: {cluster.namespace}, pod_resources_socket: /nonexistent/kubelet.sock}}
detectors: {{entries: {{dcgm: {{config: {{dcgmi_path: {NO_DCGMI}}}}}}}}}
server: {{host: 127.0.0.1, port: 0}}
""")
    log = (tmp_path / "agent.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kcover.cli", "agent", f"--config={config}", f"--kubeconfig={cluster.kubeconfig_path}",
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "KCOVER_LOGGING__FORMAT": "json"}, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{await ports.wait_bound_port(tmp_path / 'agent.log', proc)}"
        async with _watching(cluster, node) as seen:
            cond = await seen.until("Unknown", within=60.0)
        readyz = await asyncio.to_thread(_get, f"{url}/readyz")
        scraped = await asyncio.to_thread(_get, f"{url}/metrics")
        detectors = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "kcover.cli", "detectors",
                                                             "--url", url], capture_output=True, text=True,
                                            timeout=60, check=False)
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 5)
        log.close()
    assert seen.statuses == ["Unknown"], (tmp_path / "agent.log").read_text()[-3000:]
    assert cond["reason"] == "NoGPUDetector"
    assert "nvml: NVML unavailable on this node: " in cond["message"]
    assert f"dcgm: {NO_DCGMI} not found" in cond["message"]
    assert readyz[0] == 200
    assert readyz[1].endswith("[!] gpu-sight degraded: " + cond["message"] + "\nready (degraded)\n")
    assert f'kcover_agent_blind{{node="{node}"}} 1.0' in scraped[1]
    assert detectors.returncode == 1, detectors.stdout + detectors.stderr
    assert f"DEGRADED (gpu-sight): {cond['message']}" in detectors.stdout
    assert any(line.split()[:2] == ["nvml", "unavailable"] for line in detectors.stdout.splitlines())



def _get(url: str) -> tuple[int, str]:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.status, answer.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
