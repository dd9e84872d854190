"""A DRA device's return to service on the agent: its faults end on the condition's hold, and the
reporter writes one device-healthy Event, never dropped.

The table (`devicehealth`): an XID ends when it has not recurred for the hold, a fault with a check
when its detector publishes it cleared and it stays so for the hold; only faults that ask for recovery
count. The reporter, against the simulated API server with a manual clock: the Event it writes carries
`kcover.io/device-healthy`, and one the API server refuses, the rate limit holds back or the dedupe
window covers is written later, once; a new fault first makes it void. The whole path through a
controller is tests/integration/agent/test_dra_device_mapping.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from kcover import codec, model, settings
from kcover.agent import devicehealth, reporting
from kcover.aio import clock as clock_
from kcover.kube import client

simserver = pytest.importorskip("kcover.sim.server")

NODE = "gpu-node-1"
NS = "kcover-system"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HOLD = 60.0
DEV = model.DraDevice(driver="gpu.nvidia.com", pool=NODE, device="gpu-2")


def _fault(*, xid: int | None = 79, check: str = "", cleared: bool = False,
           action: model.Action | None = model.Action.CORDON_NODE_AND_RESTART,
           dra: model.DraDevice | None = DEV) -> model.CollectorEvent:
    return model.CollectorEvent(
        detector="nvml", target=model.Target(kind=model.TargetKind.DEVICE, node=NODE, device_id="GPU-2"),
        severity=model.Severity.INFO if cleared else model.Severity.ERROR,
        reason=("Cleared" if cleared else "Fault") + (check or str(xid)), message="on GPU 2",
        recommended=None if cleared else action, cleared=cleared,
        fault=model.Fault(xid=xid, gpu_index=2, gpu_uuid="GPU-2", dra=dra, check=check))


def test_an_xid_ends_when_it_has_not_recurred_for_the_hold() -> None:
    table: dict[str, devicehealth.Device] = {}
    assert devicehealth.apply(table, _fault(), 0.0)
    assert devicehealth.healthy(table, HOLD, HOLD) == []
    assert devicehealth.apply(table, _fault(), 50.0)  # recurred: the hold starts over
    assert devicehealth.healthy(table, 100.0, HOLD) == []
    [device] = devicehealth.healthy(table, 110.5, HOLD)
    assert (device.dra, device.gpu_uuid, device.gpu_index, device.node) == (DEV, "GPU-2", 2, NODE)
    assert table == {}
    assert devicehealth.healthy(table, 1000.0, HOLD) == []  # handed back once


def test_a_checked_fault_ends_when_cleared_and_held() -> None:
    table: dict[str, devicehealth.Device] = {}
    devicehealth.apply(table, _fault(xid=None, check="row_remap_failure"), 0.0)
    devicehealth.apply(table, _fault(), 0.0)
    assert devicehealth.healthy(table, 10_000.0, HOLD) == []  # active until its detector clears it
    devicehealth.apply(table, _fault(xid=None, check="row_remap_failure", cleared=True), 10_000.0)
    assert devicehealth.healthy(table, 10_000.0 + HOLD, HOLD) == []
    assert [d.dra for d in devicehealth.healthy(table, 10_000.0 + HOLD + 1, HOLD)] == [DEV]


def test_only_faults_that_may_have_tainted_a_device_are_tracked() -> None:
    table: dict[str, devicehealth.Device] = {}
    assert not devicehealth.apply(table, _fault(dra=None), 0.0)
    assert not devicehealth.apply(table, _fault(action=model.Action.REPORT), 0.0)
    assert not devicehealth.apply(table, _fault(cleared=True), 0.0)
    assert table == {}


@dataclass
class World:
    srv: Any
    kube: client.KubeClient
    clock: clock_.FakeClock

    def reporter(self, **agent: Any) -> reporting.Reporter:
        config = settings.AgentSettings(node_name=NODE, event_namespace=NS, condition_hold_seconds=HOLD,
                                        min_write_interval_seconds=0, **agent)
        return reporting.Reporter(self.kube, config, NODE, clock=self.clock)

    async def healthy_events(self) -> list[dict[str, Any]]:
        items = (await self.kube.request("GET", f"/api/v1/namespaces/{NS}/events"))["items"]
        return [e for e in items if (e["metadata"].get("annotations") or {}).get(codec.DEVICE_HEALTHY) == "true"]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with simserver.SimServer() as srv:
        srv.store.create("nodes", {"metadata": {"name": NODE}, "spec": {}, "status": {}})
        kube = client.from_configuration(srv.kube_configuration())
        try:
            yield World(srv, kube, clock_.FakeClock(T0))
        finally:
            await kube.close()


async def test_the_reporter_writes_one_device_healthy_event_after_the_hold(world: World) -> None:
    reporter = world.reporter(event_dedupe_seconds=0)
    await reporter.handle([_fault()])
    world.clock.advance(HOLD / 2)
    await reporter.sync_devices()
    assert await world.healthy_events() == []
    world.clock.advance(HOLD)
    await reporter.sync_devices()
    await reporter.sync_devices()
    [event] = await world.healthy_events()
    annotations = event["metadata"]["annotations"]
    assert (annotations[codec.FAULT_CLEARED], annotations[codec.DRA_DEVICE], annotations[codec.DRA_POOL]) == \
        ("true", "gpu-2", NODE)
    assert codec.NEED_RECOVERY not in annotations
    assert (event["reason"], event["involvedObject"]["name"], event["reportingInstance"]) == \
        (devicehealth.HEALTHY_REASON, NODE, NODE)
    node = await world.kube.request("GET", f"/api/v1/nodes/{NODE}")
    assert not any(c["type"] == "KcoverGPUHealthy" and c["status"] == "False"
                   for c in node["status"].get("conditions") or []), "a device's fault moved the node's condition"


async def test_a_refused_write_is_retried_not_dropped(world: World) -> None:
    reporter = world.reporter(event_dedupe_seconds=0)
    await reporter.handle([_fault()])
    world.srv.faults.resources = frozenset({"events"})
    world.srv.faults.error_rate, world.srv.faults.error_code = 1.0, 403
    world.clock.advance(HOLD + 1)
    await reporter.sync_devices()
    assert list(reporter.healthy_pending) == [DEV.resource_id]
    world.srv.faults.reset()
    await reporter.sync_devices()  # the backoff has not passed: no write yet
    assert list(reporter.healthy_pending) == [DEV.resource_id]
    world.clock.advance(2)
    await reporter.sync_devices()
    assert reporter.healthy_pending == {}
    assert len(await world.healthy_events()) == 1


async def test_the_rate_limit_and_the_dedupe_window_delay_it_but_do_not_drop_it(world: World) -> None:
    reporter = world.reporter(event_dedupe_seconds=HOLD * 3, max_events_per_minute=1)
    await reporter.handle([_fault()])  # takes the one token
    world.clock.advance(HOLD + 1)  # a token back, the fault ended
    await reporter.handle([_fault(xid=13, action=model.Action.RESTART_WORKLOAD, dra=None)])  # spends it
    assert list(reporter.healthy_pending) == [DEV.resource_id]
    world.clock.advance(61)
    await reporter.sync_devices()
    assert len(await world.healthy_events()) == 1
    # the device faults and heals again within the dedupe window: the second word waits for the window
    await reporter.handle([_fault(xid=48)])
    world.clock.advance(HOLD + 1)
    await reporter.sync_devices()
    assert list(reporter.healthy_pending) == [DEV.resource_id]
    assert len(await world.healthy_events()) == 1
    world.clock.advance(HOLD * 3)
    await reporter.sync_devices()
    assert reporter.healthy_pending == {}
    assert len(await world.healthy_events()) == 2


async def test_a_new_fault_voids_a_healthy_word_not_yet_written(world: World) -> None:
    reporter = world.reporter(event_dedupe_seconds=0)
    await reporter.handle([_fault()])
    world.srv.faults.resources = frozenset({"events"})
    world.srv.faults.error_rate, world.srv.faults.error_code = 1.0, 403
    world.clock.advance(HOLD + 1)
    await reporter.sync_devices()
    assert list(reporter.healthy_pending) == [DEV.resource_id]
    world.srv.faults.reset()
    await reporter.handle([_fault()])  # XID 79 again before the retry
    assert reporter.healthy_pending == {}
    world.clock.advance(5)
    await reporter.sync_devices()
    assert await world.healthy_events() == []
