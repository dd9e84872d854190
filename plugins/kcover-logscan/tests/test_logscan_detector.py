"""The logscan detector on a real bus with a fake log reader."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from importlib import metadata
from typing import Any

import logscan_tails as logtails
import pytest
from kcover_logscan import config as config_
from kcover_logscan import detector as detector_
from kcover_logscan import reading

from kcover import bus as bus_
from kcover import errors, model
from kcover import metrics as metrics_
from kcover.detectors import contract


class FakeReader:
    """Serves logs from a dict keyed by (namespace, pod, container, previous); records calls."""

    def __init__(self, logs: Mapping[tuple[str, str, str, bool], str | Exception] | None = None, *,
                 gate: asyncio.Event | None = None) -> None:
        self.logs = dict(logs or {})
        self.calls: list[dict[str, Any]] = []
        self.gate = gate
        self.active = 0
        self.peak = 0

    async def read_log(self, namespace: str, pod: str, container: str, *, previous: bool, tail_lines: int,
                       limit_bytes: int) -> str:
        self.calls.append({"namespace": namespace, "pod": pod, "container": container, "previous": previous,
                           "tail_lines": tail_lines, "limit_bytes": limit_bytes})
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            if self.gate is not None:
                await self.gate.wait()
            value = self.logs.get((namespace, pod, container, previous), errors.NotFoundError("no log", status=404))
            if isinstance(value, Exception):
                raise value
            return value
        finally:
            self.active -= 1


def pod_event(pod: str = "llama-worker-3", *, container: str = "pytorch", ordinal: int = 0,
              detector: str = "pod-status", reason: str = "ContainerError", cleared: bool = False) -> model.CollectorEvent:
    """As pod-status publishes it: the container in `fault.container`, one key per termination."""
    target = model.Target(kind=model.TargetKind.POD, namespace="team-a", name=pod, uid=f"uid-{pod}", node="gpu-node-2")
    return model.CollectorEvent(detector=detector, target=target, severity=model.Severity.ERROR, reason=reason,
                                message="container pytorch exited with code 1", cleared=cleared,
                                dedupe_key=f"{detector}/uid-{pod}/{container}/{ordinal}",
                                fault=model.Fault(container=container),
                                attributes={"exit_code": 1, "termination_reason": "Error"})


class Running:
    def __init__(self, reader: FakeReader | None, **settings: Any) -> None:
        config = config_.LogscanConfig.model_validate(settings)
        context = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=metrics_.Metrics(), log_reader=reader)
        self.bus = bus_.Bus(dedupe_window_seconds=0)
        self.out = self.bus.subscribe("test")
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(detector_.LogscanDetector("logscan", config, context).run(self.bus, self.stop),
                                        name="logscan-under-test")

    async def publish(self, *events: model.CollectorEvent) -> None:
        await asyncio.sleep(0)  # let the detector subscribe
        for event in events:
            await self.bus.publish(event)

    async def settle(self) -> list[model.CollectorEvent]:
        for _ in range(20):
            await asyncio.sleep(0)
        return [e for e in self.out.get_nowait() if e.detector == "logscan"]

    async def finish(self) -> list[model.CollectorEvent]:
        events = await self.settle()
        self.stop.set()
        async with asyncio.timeout(5):
            await self.task
        return events


def test_entry_point_registers_the_detector() -> None:
    (entry,) = [e for e in metadata.entry_points(group="kcover.detectors") if e.name == "logscan"]
    cls = entry.load()
    assert cls is detector_.LogscanDetector
    assert cls.roles == frozenset({contract.Role.CONTROLLER})
    assert cls.config_model is config_.LogscanConfig


async def test_failed_container_is_classified_from_its_log() -> None:
    reader = FakeReader({("team-a", "llama-worker-3", "pytorch", False): logtails.CUDA_ILLEGAL_ADDRESS_THEN_NCCL})
    running = Running(reader, tail_lines=150, limit_bytes=32768)
    source = pod_event()
    await running.publish(source)
    (event,) = await running.finish()

    assert reader.calls == [{"namespace": "team-a", "pod": "llama-worker-3", "container": "pytorch", "previous": False,
                             "tail_lines": 150, "limit_bytes": 32768}]
    assert event.reason == "LogClassifiedHardwareSuspect"
    assert event.severity is model.Severity.WARNING
    assert event.target == source.target
    assert event.attributes["class"] == "hardware-suspect"
    assert event.attributes["pattern"] == "cuda-illegal-memory-access"
    assert event.attributes["source_event"] == source.id
    assert event.fault == model.Fault(container="pytorch")
    assert event.attributes["lines"] == [
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "[rank3]:[E1104 07:40:02.551902 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 3] Process group watchdog thread "
        "terminated with exception: CUDA error: an illegal memory access was encountered",
    ]
    assert "an illegal memory access" in event.message


async def test_same_container_failure_is_classified_once() -> None:
    reader = FakeReader({("team-a", "llama-worker-3", "pytorch", False): logtails.NCCL_REMOTE_ERROR})
    running = Running(reader)
    await running.publish(pod_event(), pod_event(), pod_event(reason="ContainerError"))
    first = await running.settle()
    await running.publish(pod_event(ordinal=1))  # the next failure of the restarted container
    second = await running.finish()
    assert [e.reason for e in first + second] == ["LogClassifiedCommunication"] * 2
    assert [e.dedupe_key for e in first + second] == ["logscan/pod-status/uid-llama-worker-3/pytorch/0",
                                                      "logscan/pod-status/uid-llama-worker-3/pytorch/1"]
    assert len(reader.calls) == 2


async def test_state_and_last_state_terminations_are_told_apart_by_the_source_key() -> None:
    reader = FakeReader({("team-a", "llama-worker-3", "pytorch", False): logtails.NCCL_REMOTE_ERROR})
    running = Running(reader)
    await running.publish(pod_event(ordinal=1), pod_event(ordinal=0))
    assert len(await running.finish()) == 2


async def test_auto_falls_back_to_the_previous_instance() -> None:
    reader = FakeReader({("team-a", "llama-worker-3", "pytorch", False): "starting up\nloading shards\n",
                         ("team-a", "llama-worker-3", "pytorch", True): logtails.DEVICE_SIDE_ASSERT})
    running = Running(reader)
    await running.publish(pod_event(ordinal=2))
    (event,) = await running.finish()
    assert [c["previous"] for c in reader.calls] == [False, True]
    assert event.reason == "LogClassifiedApplication"
    assert event.severity is model.Severity.INFO
    assert event.attributes["previous"] is True


async def test_unclassified_logs_emit_nothing() -> None:
    reader = FakeReader({("team-a", "llama-worker-3", "pytorch", False): logtails.PYTHON_ERROR_ONLY})
    running = Running(reader, log_source="current")
    await running.publish(pod_event())
    assert await running.finish() == []
    assert len(reader.calls) == 1


@pytest.mark.parametrize("event", [
    pod_event(detector="node-condition"),
    pod_event(reason="ContainerOOMKilled"),
    pod_event(container=""),
    pod_event(cleared=True),
    model.CollectorEvent(detector="pod-status", reason="ContainerError", severity=model.Severity.ERROR,
                         target=model.Target(kind=model.TargetKind.NODE, name="gpu-node-2"),
                         fault=model.Fault(container="x")),
    model.CollectorEvent(detector="pod-status", reason="ContainerError", severity=model.Severity.ERROR,
                         target=model.Target(kind=model.TargetKind.POD, namespace="team-a", name="p", uid="u"),
                         attributes={"container": "pytorch"}),  # meaning in attributes is not read
])
async def test_other_events_are_ignored(event: model.CollectorEvent) -> None:
    reader = FakeReader()
    running = Running(reader, reasons=["ContainerError"])
    await running.publish(event)
    assert await running.finish() == []
    assert reader.calls == []


async def test_failed_read_is_retried_on_the_next_event() -> None:
    key = ("team-a", "llama-worker-3", "pytorch", False)
    reader = FakeReader({key: errors.KubeError("etcdserver: request timed out", status=500)})
    running = Running(reader)
    await running.publish(pod_event())
    assert await running.settle() == []
    reader.logs[key] = logtails.UNSPECIFIED_LAUNCH_FAILURE
    await running.publish(pod_event())
    (event,) = await running.finish()
    assert event.attributes["pattern"] == "cuda-unspecified-launch-failure"


async def test_reads_are_bounded_by_concurrency() -> None:
    gate = asyncio.Event()
    reader = FakeReader({("team-a", f"w-{i}", "pytorch", False): logtails.NCCL_REMOTE_ERROR for i in range(6)}, gate=gate)
    running = Running(reader, concurrency=2, log_source="current")
    await running.publish(*(pod_event(f"w-{i}") for i in range(6)))
    await running.settle()
    assert reader.peak == 2
    gate.set()
    events = await running.finish()
    assert len(events) == 6
    assert reader.peak == 2


async def test_stop_cancels_scans_in_flight() -> None:
    reader = FakeReader(gate=asyncio.Event())  # never opens
    running = Running(reader)
    await running.publish(pod_event())
    assert await running.finish() == []
    assert reader.active == 0


async def test_without_a_log_reader_it_is_unavailable() -> None:
    running = Running(None)
    with pytest.raises(errors.DetectorUnavailableError, match="log_reader"):
        await running.task


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], int | None]] = []

    async def text(self, path: str, *, query: Mapping[str, str | int | bool] | None = None,
                   limit_bytes: int | None = None) -> str:
        self.calls.append((path, dict(query or {}), limit_bytes))
        return "log"


async def test_kube_log_reader_gets_the_log_subresource() -> None:
    client = FakeClient()
    reader = reading.KubeLogReader(client)
    assert await reader.read_log("team-a", "llama-worker-3", "pytorch", previous=True, tail_lines=200,
                                 limit_bytes=65536) == "log"
    await reader.read_log("team-a", "llama-worker-3", "pytorch", previous=False, tail_lines=10, limit_bytes=1024)
    assert client.calls == [
        ("/api/v1/namespaces/team-a/pods/llama-worker-3/log",
         {"container": "pytorch", "tailLines": 200, "limitBytes": 65536, "previous": True}, 65536),
        ("/api/v1/namespaces/team-a/pods/llama-worker-3/log",
         {"container": "pytorch", "tailLines": 10, "limitBytes": 1024}, 1024),
    ]


def test_partial_severities_keep_the_defaults() -> None:
    config = config_.LogscanConfig.model_validate({"severities": {"communication": "Warning"}})
    assert config.severities[config_.classifying.FailureClass.COMMUNICATION] is model.Severity.WARNING
    assert config.severities[config_.classifying.FailureClass.HARDWARE_SUSPECT] is model.Severity.WARNING
    assert config.severities[config_.classifying.FailureClass.APPLICATION] is model.Severity.INFO
