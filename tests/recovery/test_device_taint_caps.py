"""kcover's device taints through the engine, on virtual time, against the simulated cluster in-process.

Each DeviceTaintRule kcover makes is first recorded in its node's ledger entry, so the caps on device taints
(`recovery.device_taints.max_per_node`, `max_per_window`) count it, and kcover ends it: when the agent says
the device is healthy again, or after `max_hold_seconds` without that word, each with a
`KcoverUntaintedDevice` Event. Assertions are on what the API server holds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from harness import engines
from harness import objects as o

from kcover import model, settings
from kcover.recovery import ledgerentries

pytestmark = pytest.mark.looptime

DRIVER = "gpu.nvidia.com"
RULES = "devicetaintrules.resource.k8s.io"


def world(nodes: int = 1) -> list[o.Obj]:
    return [obj for i in range(nodes)
            for obj in (o.node(f"n{i}"), o.resource_slice(f"n{i}-gpus", driver=DRIVER, node=f"n{i}"))]


def device(node: str, name: str) -> model.DraDevice:
    return model.DraDevice(driver=DRIVER, pool=node, device=name)


def fault(node: str, name: str, *, healthy: bool = False) -> model.CollectorEvent:
    """The agent's word on one DRA device of its node: faulty (a row remap failure), or healthy again."""
    target = (model.Target(kind=model.TargetKind.NODE, name=node, node=node) if healthy
              else model.Target(kind=model.TargetKind.DEVICE, name=node, node=node, device_id=name))
    return model.CollectorEvent(
        detector="event-watcher", severity=model.Severity.INFO if healthy else model.Severity.ERROR,
        reason="RecoveryRequested", message="healthy again" if healthy else "row remap failure", target=target,
        fault=model.Fault(dra=device(node, name), check="" if healthy else "row_remap_failure"), cleared=healthy,
        recommended=None if healthy else model.Action.CORDON_NODE, observed_at=engines.START)


def tainted(r: engines.Rig) -> list[str]:
    """The devices kcover's DeviceTaintRules select, as `node/device`."""
    return sorted(f"{x['spec']['deviceSelector']['pool']}/{x['spec']['deviceSelector']['device']}"
                  for x in r.store.iter_objects(RULES))


def recorded(r: engines.Rig, node: str) -> list[str]:
    """The devices the node's ledger entry holds tainted, as the API server stores it."""
    for obj in r.store.iter_objects("ledgerentries.kcover.io"):
        raw = (obj.get("data") or {}).get(f"n.{node}")
        if raw:
            return sorted(ledgerentries.Node.decode(orjson.loads(raw)).devices)
    return []


def untainted(r: engines.Rig) -> list[dict[str, Any]]:
    return r.events("KcoverUntaintedDevice")


async def test_a_device_taint_is_recorded_and_removed_after_max_hold_seconds_with_an_event() -> None:
    async with engines.rig(world(), overrides={"recovery": {"device_taints": {"max_hold_seconds": 600.0}}}) as r:
        await r.handle(fault("n0", "gpu-3"))
        assert tainted(r) == ["n0/gpu-3"]
        assert recorded(r, "n0") == [f"{DRIVER}/n0/gpu-3"]
        assert r.events("KcoverTaintedDevice")
        await asyncio.sleep(590.0)
        await r.tick()
        assert tainted(r) == ["n0/gpu-3"], "held for less than max_hold_seconds: kept"
        assert not untainted(r)
        await asyncio.sleep(20.0)
        await r.tick()
        assert tainted(r) == []
        assert recorded(r, "n0") == []
        (event,) = untainted(r)
        assert "max_hold_seconds" in event["message"]
        assert event["involvedObject"]["name"] == "n0"
        await r.tick()
        assert len(untainted(r)) == 1, "said once"


async def test_the_node_cap_counts_the_taints_kcover_holds_and_frees_when_a_device_is_healthy() -> None:
    async with engines.rig(world(), overrides={"recovery": {"device_taints": {"max_per_node": 1}}}) as r:
        await r.handle(fault("n0", "gpu-3"))
        await r.handle(fault("n0", "gpu-4"))
        assert tainted(r) == ["n0/gpu-3"]
        (refused,) = [e for e in r.events("KcoverRecoverySkipped") if "max_per_node" in e["message"]]
        assert "device gpu.nvidia.com/n0/gpu-4 is not tainted" in refused["message"]
        await r.handle(fault("n0", "gpu-3", healthy=True))
        assert tainted(r) == []
        assert recorded(r, "n0") == []
        assert "healthy again" in untainted(r)[0]["message"]
        await r.handle(fault("n0", "gpu-4"))
        assert tainted(r) == ["n0/gpu-4"], "the cap freed with the healthy device"


async def test_a_replayed_device_fault_taints_once_and_counts_once() -> None:
    async with engines.rig(world(2), overrides={"recovery": {"device_taints": {"max_per_window": 2}}}) as r:
        await r.handle(fault("n0", "gpu-3"))
        await r.handle(fault("n0", "gpu-3"))
        assert tainted(r) == ["n0/gpu-3"]
        assert len(r.events("KcoverTaintedDevice")) == 1
        await r.handle(fault("n1", "gpu-0"))
        assert tainted(r) == ["n0/gpu-3", "n1/gpu-0"], "the replay took no second slot of the window"
        await r.handle(fault("n1", "gpu-1"))
        assert tainted(r) == ["n0/gpu-3", "n1/gpu-0"]
        assert [e for e in r.events("KcoverRecoverySkipped") if "max_per_window" in e["message"]]


async def test_an_expired_taint_under_record_only_is_recorded_once_and_removed_once_acted_on_again() -> None:
    """`recovery.record_only: [device-taint]` set after kcover tainted a device: past `max_hold_seconds` the
    removal is recorded (once, not at every pass), the rule stays; with the class acted on again it goes."""
    async with engines.rig(world(), overrides={"recovery": {"device_taints": {"max_hold_seconds": 600.0}}}) as r:
        await r.handle(fault("n0", "gpu-3"))
        assert tainted(r) == ["n0/gpu-3"]
        acting = r.settings.recovery
        r.leader.reconfigure(acting.model_copy(update={"record_only": [settings.RecordOnly.DEVICE_TAINT]}))
        await asyncio.sleep(610.0)
        for _ in range(3):
            await r.tick()
        assert tainted(r) == ["n0/gpu-3"], "record only: the rule stays"
        assert recorded(r, "n0") == [f"{DRIVER}/n0/gpu-3"]
        assert not untainted(r)
        (would,) = r.events("KcoverRecordOnlyUntaintedDevice")
        assert "max_hold_seconds" in would["message"]
        r.leader.reconfigure(acting)
        await r.tick()
        assert tainted(r) == []
        assert recorded(r, "n0") == []
        assert len(untainted(r)) == 1
