"""The NVML detector over the fake backend: XID events, health faults, unavailability, prompt stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest

from kcover import bus as bus_
from kcover import errors, metrics, model
from kcover.detectors import contract, nvml_detector
from kcover.nvml import backend, fake


@dataclass
class Running:
    nvml: fake.FakeNvml
    sub: bus_.Subscription
    stop: asyncio.Event

    async def next(self, within: float = 3.0) -> model.CollectorEvent:
        return (await self.take(1, within))[0]

    async def take(self, n: int, within: float = 3.0) -> list[model.CollectorEvent]:
        got: list[model.CollectorEvent] = []
        async with asyncio.timeout(within):
            while len(got) < n:
                got += await self.sub.get_batch()
        return got


def _context(nvml: backend.Nvml | None, pod_lookup: contract.PodLookup | None = None) -> contract.DetectorContext:
    return contract.DetectorContext(role=contract.Role.AGENT, metrics=metrics.Metrics(), node_name="gpu-node-1",
                                    nvml=nvml, pod_lookup=pod_lookup)


def _detector(nvml: backend.Nvml | None, pod_lookup: contract.PodLookup | None = None) -> nvml_detector.NvmlDetector:
    config = nvml_detector.NvmlConfig(wait_timeout_ms=50, health_interval_seconds=0.05)
    return nvml_detector.NvmlDetector("nvml", config, _context(nvml, pod_lookup))


async def _until_registered(nvml: fake.FakeNvml) -> None:
    for _ in range(300):
        if nvml.registered:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the detector never registered for NVML events")


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    nvml = fake.FakeNvml(4)
    bus = bus_.Bus(dedupe_window_seconds=0)
    sub = bus.subscribe("test")
    stop = asyncio.Event()
    task = asyncio.create_task(_detector(nvml).run(bus, stop), name="nvml-detector")
    await _until_registered(nvml)
    yield Running(nvml, sub, stop)
    stop.set()
    await asyncio.wait_for(task, 3)


async def test_xid79_is_a_device_fault_recommending_cordon_and_restart(running: Running) -> None:
    running.nvml.xid(79, gpu_index=2)
    event = await running.next()
    assert event.reason == "XID79"
    assert event.severity is model.Severity.ERROR
    assert event.target == model.Target(kind=model.TargetKind.DEVICE, node="gpu-node-1", name="gpu-node-1",
                                        device_id="GPU-fake-0002")
    assert event.fault == model.Fault(xid=79, gpu_index=2, gpu_uuid="GPU-fake-0002")
    assert event.recommended is model.Action.CORDON_NODE_AND_RESTART
    assert (event.cleared, event.occurrences, event.window_seconds) == (False, 1, 0.0)
    assert event.attributes["class"] == "hardware"
    assert "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in event.message


async def test_an_application_xid_repeated_on_one_gpu_still_only_restarts(running: Running) -> None:
    """The node cannot tell whose job failed on its GPU: a repeat is the controller's judgement to weigh
    (different workloads on one GPU make it suspect), never a cordon recommended from the node."""
    for _ in range(3):
        running.nvml.xid(13, gpu_index=0)
        await asyncio.sleep(0.01)
    events = await running.take(3)
    assert [e.recommended for e in events] == [model.Action.RESTART_WORKLOAD] * 3
    assert [e.occurrences for e in events] == [1, 2, 3]
    assert [e.fault.xid for e in events] == [13, 13, 13]
    assert not any(e.attributes.get("escalated") for e in events)
    running.nvml.xid(13, gpu_index=1)  # another GPU has its own history
    other = await running.next()
    assert (other.recommended, other.occurrences, other.fault.gpu_index) == (model.Action.RESTART_WORKLOAD, 1, 1)


async def test_unknown_xid_is_reported(running: Running) -> None:
    running.nvml.xid(4242)
    event = await running.next()
    assert (event.reason, event.recommended, event.fault.xid, event.attributes["known_xid"]) == \
        ("XID4242", model.Action.REPORT, 4242, False)


async def test_ignored_xid_publishes_nothing(running: Running) -> None:
    running.nvml.xid(14)  # ROBUST_CHANNEL_FAKE_ERROR
    running.nvml.xid(43)
    event = await running.next()
    assert event.reason == "XID43"


async def test_double_bit_ecc_active_then_cleared(running: Running) -> None:
    running.nvml.double_bit_ecc(1, count=2)
    event = await running.next()
    assert (event.reason, event.cleared, event.fault.gpu_index) == ("DoubleBitECC", False, 1)
    assert event.fault == model.Fault(gpu_index=1, gpu_uuid="GPU-fake-0001", check="double_bit_ecc")
    assert event.recommended is model.Action.CORDON_NODE
    assert "2 uncorrectable" in event.message
    running.nvml.clear(1)
    cleared = await running.next()
    assert (cleared.reason, cleared.severity, cleared.cleared, cleared.recommended) == \
        ("DoubleBitECCCleared", model.Severity.INFO, True, None)
    assert cleared.fault == event.fault


async def test_gpu_lost_row_remap_and_retired_pages(running: Running) -> None:
    running.nvml.row_remap_failure(0)
    running.nvml.retired_pages_pending(1)
    running.nvml.gpu_lost(3)
    events = await running.take(3)
    got = {(e.reason, e.fault.gpu_index, e.fault.check, e.recommended) for e in events}
    assert got == {("RowRemapFailure", 0, "row_remap_failure", model.Action.CORDON_NODE),
                   ("RetiredPagesPending", 1, "retired_pages_pending", model.Action.REPORT),
                   ("GPULost", 3, "gpu_lost", model.Action.CORDON_NODE)}
    await asyncio.sleep(0.2)  # further polls do not repeat active faults
    assert running.sub.get_nowait() == []


async def test_pods_are_attached_when_known() -> None:
    nvml = fake.FakeNvml(1)
    bus = bus_.Bus(dedupe_window_seconds=0)
    sub = bus.subscribe("test")
    stop = asyncio.Event()

    class Pods:
        async def pods_for_devices(self, device_ids: Sequence[str]) -> list[str]:
            return [pod for uuid in device_ids for pod in ("team-a/trainer-0", f"team-b/{uuid.lower()}")]

    task = asyncio.create_task(_detector(nvml, Pods()).run(bus, stop), name="nvml-detector")
    await _until_registered(nvml)
    nvml.xid(48)
    async with asyncio.timeout(3):
        events = await sub.get_batch()
    stop.set()
    await task
    assert events[0].fault.pods == ("team-a/trainer-0", "team-b/gpu-fake-0000")


@pytest.mark.parametrize("code", [backend.CODE_NO_GPU, backend.CODE_LIBRARY_MISSING])
async def test_no_gpu_or_driver_is_unavailable(code: str) -> None:
    with pytest.raises(errors.DetectorUnavailableError):
        await _detector(fake.FakeNvml(init_error=code)).run(bus_.Bus(), asyncio.Event())


async def test_real_backend_without_driver_is_unavailable() -> None:
    with pytest.raises(errors.DetectorUnavailableError) as info:
        await _detector(None).run(bus_.Bus(), asyncio.Event())
    assert "library" in str(info.value).lower()


async def test_stop_is_prompt_and_shuts_nvml_down() -> None:
    nvml = fake.FakeNvml(1)
    stop = asyncio.Event()
    config = nvml_detector.NvmlConfig()  # the default 500 ms wait
    task = asyncio.create_task(nvml_detector.NvmlDetector("nvml", config, _context(nvml)).run(bus_.Bus(), stop),
                               name="nvml-detector")
    await _until_registered(nvml)
    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 2)
    assert time.monotonic() - started < 0.7
    assert nvml.shutdown_calls == 1


async def test_xids_and_polls_are_counted_by_code_class_and_result() -> None:
    """`kcover_xids_total{code,class}` (ignored XIDs too), `kcover_xid_classes_total{class}` from 0 for every
    class, `kcover_nvml_polls_total{result}` and the age of the last good poll."""
    nvml = fake.FakeNvml(2)
    detector = _detector(nvml)
    registry = detector.context.metrics.registry
    for xid_class in ("application", "hardware", "driver", "nvlink", "unknown"):
        assert registry.get_sample_value("kcover_xid_classes_total", {"class": xid_class}) == 0
    assert detector.context.metrics.health_checks.age("nvml") is None  # not started: no age
    bus = bus_.Bus(dedupe_window_seconds=0)
    sub = bus.subscribe("test")
    stop = asyncio.Event()
    task = asyncio.create_task(detector.run(bus, stop), name="nvml-detector")
    try:
        await _until_registered(nvml)
        nvml.xid(79, gpu_index=1)
        nvml.xid(79, gpu_index=0)
        nvml.xid(13)
        nvml.xid(14)  # ignored by the policy: counted, not published
        got = Running(nvml, sub, stop)
        await got.take(3)
        async with asyncio.timeout(3):
            while not (registry.get_sample_value("kcover_xids_total", {"code": "14", "class": "driver"})  # noqa: ASYNC110 -- polled: a counter has no event to wait on
                       and registry.get_sample_value("kcover_nvml_polls_total", {"result": "ok"})):
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(task, 3)
    assert registry.get_sample_value("kcover_xids_total", {"code": "79", "class": "hardware"}) == 2
    assert registry.get_sample_value("kcover_xids_total", {"code": "13", "class": "application"}) == 1
    assert registry.get_sample_value("kcover_xid_classes_total", {"class": "hardware"}) == 2
    assert registry.get_sample_value("kcover_xid_classes_total", {"class": "application"}) == 1
    assert registry.get_sample_value("kcover_xids_total", {"code": "14", "class": "driver"}) == 1  # ignored, counted
    assert (registry.get_sample_value("kcover_nvml_polls_total", {"result": "ok"}) or 0) >= 1
    assert registry.get_sample_value("kcover_nvml_polls_total", {"result": "failed"}) == 0
    age = detector.context.metrics.health_checks.age("nvml")
    assert age is not None
    assert age < 3
