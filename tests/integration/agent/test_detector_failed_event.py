"""A detector that fails on a node leaves a `KcoverDetectorFailed` Event the API server keeps, on every
backend (the simulated server and a real kube-apiserver), read back as a user would: `kubectl get events`
in the agent's namespace shows it, about the Node, reported by the agent. The agent writes its Events in
its release namespace, where an Event about a cluster-scoped Node must name that namespace in its
reference (kube-apiserver answers 422 otherwise, and the failure used to be swallowed as a warning)."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any, ClassVar

from kcover import layering, metrics, settings
from kcover.agent import running as agent_running
from kcover.detectors import contract, registry
from kcover.nvml import fake

Cluster = Any  # tests/backends.py's Cluster


class Crasher:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.AGENT})
    config_model = contract.EmptyConfig

    def __init__(self, name: str, config: contract.EmptyConfig, context: contract.DetectorContext) -> None:
        pass

    async def run(self, bus: contract.Bus, stop: asyncio.Event) -> None:
        raise RuntimeError("sensor on fire")


def _settings(ns: str, node: str) -> settings.Settings:
    entries: dict[str, Any] = {name: {"enabled": False} for name in settings.BUILTIN_DETECTORS}
    return layering.layer(file_data={
        "agent": {"node_name": node, "event_namespace": ns},
        "detectors": {"entries": {**entries, "crasher": {"enabled": True}}, "restart_initial_seconds": 0.1},
    }).settings


async def test_a_failed_detector_leaves_an_event_on_its_node_that_the_api_server_keeps(cluster: Cluster) -> None:
    ns = cluster.namespace
    node = f"gpu-failing-{secrets.token_hex(3)}"
    reg = registry.Registry([registry.DetectorInfo("crasher", "x:Crasher", "a-plugin", "0", Crasher)])  # type: ignore[arg-type]
    stop = asyncio.Event()
    async with cluster.new_client() as kube:
        agent = agent_running.Agent(_settings(ns, node), client=kube, metrics=metrics.Metrics(), health=None,
                                    node=node, nvml=fake.FakeNvml(1), detector_registry=reg,
                                    reporter_tick_seconds=0.1)
        task = asyncio.create_task(agent.run(stop), name="agent")
        found: list[dict[str, Any]] = []
        try:
            deadline = time.monotonic() + 15
            while not found and time.monotonic() < deadline:  # polling the API server as kubectl would
                listed = await kube.request("GET", f"/api/v1/namespaces/{ns}/events")
                found = [e for e in listed.get("items") or [] if e.get("reason") == "KcoverDetectorFailed"]
                if not found:
                    await asyncio.sleep(0.2)
            restarts = agent.supervisor.describe()["crasher"]["restarts"]
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
    assert len(found) == 1, "one Event per failure cause, kept by the API server"
    assert isinstance(restarts, int)
    assert restarts >= 1
    event = found[0]
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": node, "namespace": ns}
    assert event["metadata"]["namespace"] == ns
    assert (event["type"], event["reportingComponent"], event["reportingInstance"]) == \
        ("Warning", "kcover.io/agent", node)
    assert f"optional detector crasher failed on node {node} (RuntimeError: sensor on fire)" in event["message"]
    assert "kcover.io/need-recovery" not in (event["metadata"].get("annotations") or {})  # nothing acts on it
