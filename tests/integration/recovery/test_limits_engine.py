"""The breaker's limits hold for faults that arrive together, against a real HTTP API server (sim, kube-apiserver).

The engine plans every fault of a batch before it carries any out, and reserves what each plan takes, so
five node faults handed over at once with room for one cordon cordon one node; five device faults at once
with room for one device taint (per window, or per node) taint one device. What the API server ends up
holding is asserted: the Nodes' `spec.unschedulable`, kcover's DeviceTaintRules, the refusals' Events.
Each test makes its own nodes (cluster-scoped, shared by the tests of a session on a real server) and
builds the engine's cache from those alone, so the breaker counts exactly them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from enginekit import Clock, Cluster, Rig, events, items

from kcover import model
from kcover.kube import caching

DRIVER = "gpu.nvidia.com"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


@contextlib.asynccontextmanager
async def _nodes(cluster: Cluster, count: int, *, slices: bool = False) -> AsyncIterator[list[str]]:
    """`count` GPU nodes of this test (with a ResourceSlice publishing gpu-0..7 each, with `slices`);
    deleted afterwards, with kcover's DeviceTaintRules of their devices."""
    kube = cluster.harness.kube
    names = [f"lim-{cluster.namespace}-{i}" for i in range(count)]
    try:
        for name in names:
            await kube.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                              "metadata": {"name": name}})
            node = await kube.request("GET", f"/api/v1/nodes/{name}")
            node["status"] = {"capacity": {"nvidia.com/gpu": "8", "cpu": "64"}}
            await kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node)
            if slices:
                await kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body={
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{name}-gpus"},
                    "spec": {"driver": DRIVER, "nodeName": name,
                             "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                             "devices": [{"name": f"gpu-{i}"} for i in range(8)]}})
        yield names
    finally:
        for rule in await _rules(cluster, names):
            await kube.request("DELETE", f"{RULES}/{rule['metadata']['name']}")
        for name in names:
            with contextlib.suppress(Exception):
                await kube.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{name}-gpus")
            await kube.request("DELETE", f"/api/v1/nodes/{name}")


async def _snapshot(cluster: Cluster, names: list[str]) -> caching.ClusterCache:
    """The product's cache holding this test's nodes and their ResourceSlices only."""
    mine = [n for n in await items(cluster, "/api/v1/nodes") if n["metadata"]["name"] in names]
    mine += [s for s in await items(cluster, "/apis/resource.k8s.io/v1/resourceslices")
             if s["spec"].get("nodeName") in names]
    return caching.ClusterCache.offline(mine)


async def _rules(cluster: Cluster, names: list[str]) -> list[dict[str, Any]]:
    listed = await cluster.harness.kube.request("GET", RULES)
    return [r for r in listed.get("items") or []
            if (r["metadata"].get("annotations") or {}).get("kcover.io/node") in names]


async def _breaker_refusals(cluster: Cluster, names: list[str], code: str = "BreakerOpen") -> list[str]:
    return [e["involvedObject"]["name"] for e in await events(cluster)
            if e.get("reason") == "KcoverRecoverySkipped" and code in e.get("message", "")
            and e["involvedObject"].get("name") in names]


def _node_fault(node: str, clock: Clock) -> model.CollectorEvent:
    return model.CollectorEvent(detector="node-condition", severity=model.Severity.ERROR, reason="XID79",
                                message="GPU has fallen off the bus", observed_at=clock.now(),
                                recommended=model.Action.CORDON_NODE,
                                target=model.Target(kind=model.TargetKind.NODE, name=node, node=node))


def _device_fault(node: str, device: str, clock: Clock) -> model.CollectorEvent:
    """The agent's report of a faulty DRA device (a row remap failure: the device is isolated, nothing restarted)."""
    return model.CollectorEvent(
        detector="event-watcher", severity=model.Severity.ERROR, reason="GPULost", message="row remap failure",
        target=model.Target(kind=model.TargetKind.DEVICE, name=node, node=node, device_id=device),
        fault=model.Fault(dra=model.DraDevice(driver=DRIVER, pool=node, device=device), check="row_remap_failure"),
        recommended=model.Action.CORDON_NODE, observed_at=clock.now())


async def test_five_node_faults_at_once_with_a_limit_of_one_cordon_exactly_one(cluster: Cluster) -> None:
    async with _nodes(cluster, 10) as names:
        rig = Rig(cluster, Clock(), await _snapshot(cluster, names), max_cordoned_fraction=0.1)
        await rig.leader.handle([_node_fault(name, rig.clock) for name in names[:5]])
        cordoned = [n["metadata"]["name"] for n in await items(cluster, "/api/v1/nodes")
                    if n["metadata"]["name"] in names and n["spec"].get("unschedulable")]
        refused = await _breaker_refusals(cluster, names)
    assert len(cordoned) == 1, cordoned
    assert sorted([*cordoned, *refused]) == sorted(names[:5])


async def test_five_device_faults_at_once_with_a_window_of_one_taint_exactly_one(cluster: Cluster) -> None:
    async with _nodes(cluster, 10, slices=True) as names:
        rig = Rig(cluster, Clock(), await _snapshot(cluster, names), device_taints={"max_per_window": 1})
        await rig.leader.handle([_device_fault(name, "gpu-3", rig.clock) for name in names[:5]])
        rules = await _rules(cluster, names)
        refused = await _breaker_refusals(cluster, names)
        nodes = [n for n in await items(cluster, "/api/v1/nodes") if n["metadata"]["name"] in names]
    assert len(rules) == 1, [r["metadata"]["annotations"] for r in rules]
    tainted = rules[0]["metadata"]["annotations"]["kcover.io/node"]
    assert sorted([tainted, *refused]) == sorted(names[:5])
    assert not [n for n in nodes if n["spec"].get("unschedulable")], "a device fault cordons no node"


async def test_five_faulty_devices_of_one_node_with_a_cap_of_two_taint_two(cluster: Cluster) -> None:
    async with _nodes(cluster, 2, slices=True) as names:
        rig = Rig(cluster, Clock(), await _snapshot(cluster, names), device_taints={"max_per_node": 2})
        await rig.leader.handle([_device_fault(names[0], f"gpu-{i}", rig.clock) for i in range(5)])
        await rig.leader.handle([_device_fault(names[1], "gpu-0", rig.clock)])
        rules = await _rules(cluster, names)
        refused = await _breaker_refusals(cluster, names, "DeviceTaintLimit")
    on_first = [r for r in rules if r["metadata"]["annotations"]["kcover.io/node"] == names[0]]
    assert len(on_first) == 2, [r["spec"]["deviceSelector"] for r in on_first]
    assert refused == [names[0]] * 3
    assert len(rules) == 3, "the cap is per node, and no trip: the other node's device is tainted"
