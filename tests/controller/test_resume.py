"""The controller resumes its recovery engine once per leadership term, before any batch (simulated API server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from kcover import metrics, model, serving, settings
from kcover.controller import recovering, running
from kcover.detectors import registry
from kcover.kube import client as client_
from kcover.sim import server as simserver

NS = "kcover"


class Engine:
    def __init__(self, deps: recovering.EngineDeps) -> None:
        self.deps = deps
        self.calls: list[str] = []

    async def resume(self) -> None:
        assert self.deps.is_leader()
        self.calls.append(f"resume:{self.deps.epoch()}")

    async def handle(self, events: Sequence[model.CollectorEvent]) -> None:
        self.calls += [f"handle:{e.target.name}" for e in events]

    def reconfigure(self, recovery: settings.RecoverySettings) -> None:
        pass


@pytest.fixture
async def srv() -> AsyncIterator[simserver.SimServer]:
    async with simserver.SimServer() as server:
        server.store.create("namespaces", {"metadata": {"name": NS}})
        yield server


def _settings(identity: str, *, lease: bool) -> settings.Settings:
    return settings.Settings.model_validate({
        "lease": {"enabled": lease, "identity": identity, "namespace": NS, "lease_duration_seconds": 2.0,
                  "renew_deadline_seconds": 1.5, "retry_period_seconds": 0.2},
        "detectors": {"entries": {name: {"enabled": False} for name in settings.BUILTIN_DETECTORS}},
        "kube": {"workload_kinds": [], "watch_events": False},
    })


async def _until(predicate: Callable[[], Any], within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110  (polling in-process state)
            await asyncio.sleep(0.01)


def _event(name: str) -> model.CollectorEvent:
    return model.CollectorEvent(detector="test", reason="ContainerError", severity=model.Severity.ERROR,
                                target=model.Target(kind=model.TargetKind.POD, namespace="ml", name=name))


@pytest.mark.parametrize("lease", [True, False])
async def test_the_engine_is_resumed_once_per_term_before_any_batch(srv: simserver.SimServer, lease: bool) -> None:
    engines: list[Engine] = []

    def factory(deps: recovering.EngineDeps) -> Engine:
        engines.append(Engine(deps))
        return engines[-1]

    async with client_.from_configuration(srv.kube_configuration()) as kube:
        ctl = running.Controller(_settings("a", lease=lease), client=kube, metrics=metrics.Metrics(),
                                 health=serving.Health(), detector_registry=registry.discover(),
                                 engine_factory=factory)
        stop = asyncio.Event()
        task = asyncio.create_task(ctl.run(stop), name="controller")
        try:
            await _until(lambda: engines[0].calls)
            await ctl.bus.publish(_event("p1"))
            await ctl.bus.publish(_event("p2"))
            await _until(lambda: len(engines[0].calls) == 3)
            assert engines[0].calls == ["resume:1", "handle:p1", "handle:p2"]
        finally:
            stop.set()
            await task
