"""A node whose agent cannot see its GPUs is no signal either way, on every cluster backend.

The real controller (uncordon on, the node-condition detector's hold 1 s) and real agents that have no NVML and no
`dcgmi` run against the backend. Their `KcoverGPUHealthy=Unknown` (`NoGPUDetector`) must neither cordon a
schedulable node nor return one kcover cordoned, however long it lasts; the same cordoned node, once its
condition says `True`, is returned after the hold (so the watch for a return can see one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import test_closed_loop_scenarios as closed
import test_recovery_scenarios as base

from kcover import layering, metrics, serving
from kcover.agent import running as agent_running
from kcover.nvml import backend, fake

Cluster = Any
HOLD = 1.0
"""The node-condition detector's recovered_hold_seconds in these tests (`closed._node_settings`)."""


@contextlib.asynccontextmanager
async def _blind_agents(cluster: Cluster, nodes: list[str], gpu: str) -> AsyncIterator[None]:
    """kcover's agent on each node, with no NVML driver and no `dcgmi`; the test's GPU resource is what makes a GPU
    node (`kube.gpu_resources`)."""
    stop = asyncio.Event()
    clients = [cluster.new_client() for _ in nodes]
    tasks = []
    for kube, node in zip(clients, nodes, strict=True):
        cfg = layering.layer(file_data={
            "kube": {"gpu_resources": [gpu]},
            "agent": {"node_name": node, "event_namespace": cluster.namespace, "condition_hold_seconds": 0.2,
                      "min_write_interval_seconds": 0.0, "pod_resources_socket": "/nonexistent/kubelet.sock"},
            "detectors": {"settle_seconds": 0.5, "entries": {"dcgm": {"config": {"dcgmi_path": "/nonexistent/dcgmi"}}}},
        }).settings
        agent = agent_running.Agent(cfg, client=kube, metrics=metrics.Metrics(role=metrics.AGENT, process=False),
                                    health=serving.Health(), node=node,
                                    nvml=fake.FakeNvml(8, init_error=backend.CODE_LIBRARY_MISSING),
                                    reporter_tick_seconds=0.1)
        tasks.append(asyncio.create_task(agent.run(stop), name=f"agent:{node}"))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait(tasks, timeout=10.0)
        for kube in clients:
            await kube.close()
        for task in tasks:
            task.result()


async def _condition(cluster: Cluster, node: str) -> dict[str, Any] | None:
    obj = await closed._node_obj(cluster, node)
    return next((c for c in obj["status"].get("conditions") or [] if c["type"] == "KcoverGPUHealthy"), None)


def _taints(obj: dict[str, Any]) -> set[str]:
    return {t.get("key") for t in obj["spec"].get("taints") or []}


async def test_an_unknown_agent_condition_neither_cordons_nor_returns_a_node(cluster: Cluster, tmp_path: Path) -> None:
    gpu = closed._gpu_resource()
    fresh, cordoned = [await closed._gpu_node(cluster, gpu) for _ in range(2)]
    assert closed._node_settings(gpu)["detectors"]["entries"]["node-condition"]["config"]["recovered_hold_seconds"] \
        == HOLD
    async with base._controllers(cluster, tmp_path, extra=closed._node_settings(gpu), uncordon_enabled=True,
                                 resume_interval_seconds=0.3):
        await closed._gpu_condition(cluster, cordoned, healthy=False)  # a fault the agent saw before it went blind
        await closed._until_node_event(cluster, cordoned, base.CORDONED)
        async with _blind_agents(cluster, [fresh, cordoned], gpu):
            for node in (fresh, cordoned):
                async def unknown(node: str = node) -> bool:
                    cond = await _condition(cluster, node)
                    return bool(cond and cond["status"] == "Unknown")
                await base._until(unknown, f"KcoverGPUHealthy=Unknown on {node}")
            await asyncio.sleep(3 * HOLD + base.SETTLE)  # three holds: long past the one a return waits for
            during = {n: await closed._node_obj(cluster, n) for n in (fresh, cordoned)}
            conditions = {n: await _condition(cluster, n) for n in (fresh, cordoned)}
            writes = {n: [e for r in (base.CORDONED, closed.UNCORDONED) for e in await closed._node_events(cluster, n, r)]
                      for n in (fresh, cordoned)}
        await closed._gpu_condition(cluster, cordoned, healthy=True)  # its agent sees again
        back = await closed._until_node_event(cluster, cordoned, closed.UNCORDONED)
    assert conditions[fresh] is not None
    assert conditions[cordoned] is not None
    assert (conditions[fresh]["reason"], conditions[cordoned]["reason"]) == ("NoGPUDetector", "NoGPUDetector")
    assert not during[fresh]["spec"].get("unschedulable")
    assert closed.TAINT not in _taints(during[fresh])
    assert writes[fresh] == []  # no cordon of any kind
    assert during[cordoned]["spec"].get("unschedulable") is True  # not returned on Unknown
    assert closed.TAINT in _taints(during[cordoned])
    assert [e["reason"] for e in writes[cordoned]] == [base.CORDONED]
    assert back["involvedObject"]["name"] == cordoned
