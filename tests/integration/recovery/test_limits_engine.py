"""The breaker's limits hold for faults that arrive together, against a real HTTP API server (sim, kube-apiserver).

The engine plans every fault of a batch before it carries any out, and reserves what each plan takes, so
five node faults handed over at once with room for one cordon cordon one node; five device faults at once
with room for one device taint (per window, or per node) taint one device. A storm of a hundred node faults
on a thousand GPU nodes, handed over in ten batches within a minute with the shipped limits, cordons at most
the window's cap and latches the breaker; its Event, `kcover status` and `kcover breaker reset` (the real
commands, through a kubeconfig) say so, and a reset of the breaker once it is closed changes nothing. What
the API server ends up holding is asserted: the Nodes' `spec.unschedulable`, kcover's DeviceTaintRules, the
refusals' Events, the ledger's breaker. Each test makes its own nodes (cluster-scoped, shared by the tests of
a session on a real server) and builds the engine's cache from those alone, so the breaker counts exactly them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import yaml
from enginekit import Clock, Cluster, Rig, events, items, run_cli

from kcover import errors, model, settings
from kcover.kube import caching, gateway, gpus
from kcover.recovery import admission, controls, ledger, ledgerentries
from kcover.status import report

DRIVER = "gpu.nvidia.com"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


IN_FLIGHT = 32
"""Requests a test has in flight at once to make or remove its nodes: a thousand in seconds, the server not flooded."""


async def _bounded(calls: list[Callable[[], Awaitable[None]]]) -> None:
    """Await every call, at most `IN_FLIGHT` at once."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(call: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await call()

    async with asyncio.TaskGroup() as tg:
        for i, call in enumerate(calls):
            tg.create_task(one(call), name=f"node-request-{i}")


@contextlib.asynccontextmanager
async def _nodes(cluster: Cluster, count: int, *, slices: bool = False,
                 gpu: str = "nvidia.com/gpu") -> AsyncIterator[list[str]]:
    """`count` GPU nodes of this test (8 of `gpu` each; with a ResourceSlice publishing gpu-0..7 each, with
    `slices`), made concurrently; deleted afterwards, with kcover's DeviceTaintRules of their devices. With
    `slices`, skips on a server that serves no v1 ResourceSlices or no v1beta2 DeviceTaintRules (1.29.6)."""
    kube = cluster.harness.kube
    if slices:
        for path in (SLICES, RULES):
            if not await _served(cluster, path):
                pytest.skip(f"this server serves no {path.removeprefix('/apis/')}: the device tests need both")
    names = [f"lim-{cluster.namespace}-{i}" for i in range(count)]

    async def make(name: str) -> None:
        await kube.request("POST", "/api/v1/nodes", body={
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"capacity": {gpu: "8", "cpu": "64"}}})  # a node's status is kept on create (the kubelet's way)
        if slices:
            await kube.request("POST", SLICES, body={
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{name}-gpus"},
                "spec": {"driver": DRIVER, "nodeName": name,
                         "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": f"gpu-{i}"} for i in range(8)]}})

    async def remove(name: str) -> None:
        if slices:
            with contextlib.suppress(errors.NotFoundError):
                await kube.request("DELETE", f"{SLICES}/{name}-gpus")
        with contextlib.suppress(errors.NotFoundError):
            await kube.request("DELETE", f"/api/v1/nodes/{name}")

    try:
        await _bounded([functools.partial(make, name) for name in names])
        yield names
    finally:
        for rule in await _rules(cluster, names):
            await kube.request("DELETE", f"{RULES}/{rule['metadata']['name']}")
        await _bounded([functools.partial(remove, name) for name in names])


async def _mine(cluster: Cluster, names: list[str], *, slices: bool = True) -> list[dict[str, Any]]:
    """This test's nodes (and their ResourceSlices, with `slices`) as the server holds them."""
    wanted = set(names)
    mine = [n for n in await items(cluster, "/api/v1/nodes") if n["metadata"]["name"] in wanted]
    if slices and await _served(cluster, SLICES):  # a server without v1 ResourceSlices holds none
        mine += [s for s in await items(cluster, SLICES) if s["spec"].get("nodeName") in wanted]
    return mine


async def _snapshot(cluster: Cluster, names: list[str]) -> caching.ClusterCache:
    """The product's cache holding this test's nodes and their ResourceSlices only."""
    return caching.ClusterCache.offline(await _mine(cluster, names))


async def _served(cluster: Cluster, path: str) -> bool:
    try:
        await cluster.harness.kube.request("GET", path, query={"limit": "1"})
    except errors.NotFoundError:
        return False
    return True


async def _rules(cluster: Cluster, names: list[str]) -> list[dict[str, Any]]:
    """kcover's DeviceTaintRules of these nodes' devices (none on a server that serves none)."""
    try:
        listed = await cluster.harness.kube.request("GET", RULES)
    except errors.NotFoundError:
        return []
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


# ------------------------------------------------------------------------------------------------ a storm

FLEET, STORM, BATCHES = 1000, 100, 10
"""A thousand GPU nodes; a hundred node faults, handed to the engine in ten batches over a minute."""
LEDGER_ENTRIES = "/apis/kcover.io/v1alpha1/namespaces/{ns}/ledgerentries"


async def _breaker(cluster: Cluster) -> ledgerentries.Breaker:
    """The breaker as the ledger holds it, read over the API as `kcover breaker reset` reads it."""
    book = ledger.Ledger(gateway.Http(cluster.client), namespace=cluster.namespace, name="kcover-ledger",
                         retention_seconds=lambda: 3600.0)
    await book.load()
    return book.breaker()


async def _versions(cluster: Cluster) -> list[tuple[str, str]]:
    """Every LedgerEntry of the test and its resourceVersion: any write to the ledger changes them."""
    return sorted((e["metadata"]["name"], e["metadata"]["resourceVersion"])
                  for e in await items(cluster, LEDGER_ENTRIES.format(ns=cluster.namespace)))


async def _until_created(cluster: Cluster, name: str, reset: asyncio.Task[Any]) -> dict[str, Any]:
    """The ConfigMap `name` of the test's namespace, once `kcover breaker reset` (running as `reset`) wrote it."""
    gw = gateway.Http(cluster.client)
    deadline = time.monotonic() + 30.0
    while (cm := await gw.get_config_map(cluster.namespace, name)) is None:
        assert not reset.done(), reset.result()
        assert time.monotonic() < deadline, f"`kcover breaker reset` wrote no ConfigMap {name} within 30s"
        await asyncio.sleep(0.1)
    return {**cm, "apiVersion": "v1", "kind": "ConfigMap"}


async def test_a_hundred_node_faults_on_a_thousand_gpu_nodes_within_a_minute_cordon_at_most_the_window_cap_and_latch(
        cluster: Cluster) -> None:
    ns = cluster.namespace
    gpu = f"gpu-{secrets.token_hex(3)}.kcover-test.io/gpu"  # this test's nodes alone are GPU nodes, on a shared server
    shipped = settings.Settings().recovery  # the limits in force are the shipped defaults
    cap, at_once = admission.window_cordon_limit(shipped, FLEET), admission.held_cordon_limit(shipped, FLEET)
    await cluster.client.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body={  # the chart's, as installed
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kcover-config"},
        "data": {"config.yaml": yaml.safe_dump({"kube": {"gpu_resources": [gpu], "gpu_dra_drivers": []}})}})
    gw = gateway.Http(cluster.client)
    where = ("--kubeconfig", cluster.kubeconfig_path, "--namespace", ns)
    fresh = await asyncio.to_thread(run_cli, "breaker", "reset", *where)  # before kcover ever acted
    fresh_ledger, fresh_controls = await _versions(cluster), await gw.get_config_map(ns, "kcover-controls")
    assert fresh == (0, "the breaker is not latched: nothing to reset, nothing was changed\n", "")
    assert (fresh_ledger, fresh_controls) == ([], None), "nothing written"
    async with _nodes(cluster, FLEET, gpu=gpu) as names:
        rule = gpus.GpuRule.of([gpu], [])
        clock = Clock()
        clock.moment = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=60)  # the storm's minute ends now
        rig = Rig(cluster, clock, caching.ClusterCache.offline(await _mine(cluster, names, slices=False),
                                                               gpu_rule=rule, controls=(ns, "kcover-controls")))
        faulty = names[:STORM]
        per_batch = STORM // BATCHES
        for batch in range(BATCHES):
            await rig.leader.handle([_node_fault(n, clock) for n in faulty[batch * per_batch:(batch + 1) * per_batch]])
            rig.snap.load(await _mine(cluster, names, slices=False))  # what the cache's watches show it next
            clock.moment += dt.timedelta(seconds=60 / BATCHES)  # batches at 0, 6, ..., 54 s of the minute
        nodes = await _mine(cluster, names, slices=False)
        cordoned = sorted(n["metadata"]["name"] for n in nodes if n["spec"].get("unschedulable"))
        skipped = [e for e in await events(cluster) if e.get("reason") == "KcoverRecoverySkipped"
                   and e["involvedObject"].get("name") in set(names)]
        latched = [e for e in await events(cluster) if e.get("reason") == "KcoverBreakerLatched"]
        tripped = await _breaker(cluster)
        status_code, text, status_err = await asyncio.to_thread(run_cli, "status", *where)
        json_code, doc_text, _ = await asyncio.to_thread(run_cli, "status", *where, "-o", "json")
        doc = json.loads(doc_text)

        # the storm: the window's cap holds it across batches (each batch alone fits the cap)
        assert (cap, at_once) == (10, 50), "the smaller of 10 per window and 1% of 1,000; 5% of 1,000 at once, at most 50"
        assert 0 < len(cordoned) <= cap, cordoned
        assert set(cordoned) <= set(faulty)
        refused = {e["involvedObject"]["name"]: e["message"] for e in skipped}
        assert sorted([*cordoned, *refused]) == sorted(faulty), "every fault is cordoned or refused, and said so"
        codes = sorted({message.split(":")[0] for message in refused.values()})
        assert codes == ["BreakerLatched", "BreakerOpen"], codes  # the trip, then the latch
        # the breaker latched, where the product records it (LedgerEntry kcover-ledger.breaker)
        assert tripped.latched
        assert f"recovery.max_cordons_per_window {shipped.max_cordons_per_window}" in tripped.reason
        assert f"kcover cordoned {len(cordoned)} nodes within 3600s (limit {cap}" in tripped.reason
        # its Event: what tripped it and what a reset does
        assert len(latched) == 1, [e["message"] for e in latched]
        assert (latched[0]["involvedObject"]["kind"], latched[0]["involvedObject"]["name"]) == ("ConfigMap",
                                                                                                "kcover-controls")
        assert tripped.reason in latched[0]["message"]
        assert "`kcover breaker reset`" in latched[0]["message"]
        assert f"{shipped.breaker_cooldown_seconds:g}s (recovery.breaker_cooldown_seconds)" in latched[0]["message"]
        # `kcover status`: the open breaker and the limits in force
        assert (status_code, json_code) == (1, 1), text + status_err
        assert f"settings:   ConfigMap {ns}/kcover-config (the controllers')" in text
        assert f"breaker:    LATCHED OPEN since {doc['breaker']['since']}: {tripped.reason}" in text
        assert f"            a reset {doc['breaker']['reset_does']}" in text
        assert (doc["breaker"]["latched"], doc["breaker"]["reason"]) == (True, tripped.reason)
        assert doc["breaker"]["since"] == report.when(tripped.opened_at)
        assert doc["breaker"]["reset_does"] == (
            f"closes the latch; then restarts and cordons stay refused for {shipped.breaker_cooldown_seconds:g}s "
            "(recovery.breaker_cooldown_seconds), no restart is held, and the breaker's window starts again at the "
            "reset (the limits on what is cordoned at once still count every cordon)")
        assert doc["gpu_nodes"] == FLEET
        limits = {lim["name"]: lim for lim in doc["limits"]}
        window = limits["cordons in 3600s"]
        assert (window["used"], window["limit"], window["reached"]) == (len(cordoned), cap, len(cordoned) == cap)
        assert window["setting"] == (f"recovery.max_cordons_per_window {shipped.max_cordons_per_window}, "
                                     f"max_cordons_per_window_fraction {shipped.max_cordons_per_window_fraction:g} "
                                     f"of {FLEET} GPU nodes")
        assert limits["nodes cordoned at once"]["limit"] == at_once
        assert {c["node"] for c in doc["cordoned"]} >= set(cordoned)
        assert f"  cordons in 3600s:                    {len(cordoned)} of {cap}  (" in text
        assert any(p.startswith(f"the breaker is latched open since {doc['breaker']['since']} ({tripped.reason})")
                   for p in doc["problems"])

        # A person resets it (the command asks, the leader's next pass closes it), then asks again: nothing more.
        clock.moment = dt.datetime.now(dt.UTC)
        asking = asyncio.create_task(asyncio.to_thread(run_cli, "breaker", "reset", *where, "--wait", "30"),
                                     name="kcover-breaker-reset")
        request = await _until_created(cluster, "kcover-controls", asking)
        rig.snap.load([*await _mine(cluster, names, slices=False), request])
        await rig.leader.resume()
        first = await asking
        closed, ledger_then = await _breaker(cluster), await _versions(cluster)
        controls_then = await gw.get_config_map(ns, "kcover-controls")
        again = await asyncio.to_thread(run_cli, "breaker", "reset", *where)
        await rig.leader.resume()  # the leader's next pass: the request it acted on resets nothing again
        ledger_now, controls_now = await _versions(cluster), await gw.get_config_map(ns, "kcover-controls")
        still = await _breaker(cluster)
        _, after_text, _ = await asyncio.to_thread(run_cli, "status", *where, "-o", "json")
        after = json.loads(after_text)
        resets = [e for e in await events(cluster) if e.get("reason") == "KcoverBreakerReset"]
        cordoned_after = sorted(n["metadata"]["name"] for n in await _mine(cluster, names, slices=False)
                                if n["spec"].get("unschedulable"))
    # a real reset, then a reset of the closed breaker: it changes nothing and says so
    assert first[0] == 0, first
    assert first[1].startswith(f"breaker reset by the leader; kcover acts again after "
                               f"{shipped.breaker_cooldown_seconds:g}s (recovery.breaker_cooldown_seconds)"), first
    assert not closed.latched
    assert closed.closed_at == round(clock.now().timestamp(), 3)  # the leader's reset, at its now (ms)
    assert closed.reset_request == request["metadata"]["annotations"][controls.BREAKER_RESET]  # acted on, once
    assert len(resets) == 1, [e["message"] for e in resets]
    assert again == (0, "the breaker is not latched: nothing to reset, nothing was changed\n", ""), again
    assert ledger_now == ledger_then, "no ledger write"
    assert controls_then is not None
    assert controls_now is not None
    assert controls_now["metadata"]["resourceVersion"] == controls_then["metadata"]["resourceVersion"]
    assert (still.closed_at, still.reset_request) == (closed.closed_at, closed.reset_request), "no new cooldown"
    assert after["breaker"]["reset_at"] == report.when(closed.closed_at)  # the cooldown of the one real reset
    assert after["breaker"]["reset_does"].startswith("nothing: the breaker is not latched")
    # the window starts again at the reset: what tripped it is not counted twice; what is held at once still is
    limits_after = {lim["name"]: lim for lim in after["limits"]}
    since_reset = next(v for k, v in limits_after.items() if k.startswith("cordons since the breaker's reset"))
    assert (since_reset["used"], since_reset["limit"], since_reset["reached"]) == (0, cap, False)
    assert limits_after["nodes cordoned at once"]["used"] == len(cordoned)
    assert cordoned_after == cordoned
