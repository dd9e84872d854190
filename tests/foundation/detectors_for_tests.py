"""Small detectors used by the supervisor and reload tests (real classes, registered as a plugin would be)."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from kcover import bus as bus_
from kcover import errors, model
from kcover.detectors import contract


class TickConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval_seconds: float = 1.0
    label: str = "tick"


class Ticker:
    """Publishes one event per interval, labelled with its config, so a test sees which config runs."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = TickConfig
    starts: ClassVar[list[str]] = []

    def __init__(self, name: str, config: BaseModel, context: contract.DetectorContext) -> None:
        assert isinstance(config, TickConfig)
        self.name = name
        self.config = config

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        self.starts.append(self.config.label)
        n = 0
        while not stop.is_set():
            n += 1
            bus.publish_nowait(model.CollectorEvent(
                detector=self.name, target=model.Target(kind=model.TargetKind.NODE, name="n"),
                severity=model.Severity.INFO, reason="Tick", message=f"{self.config.label}-{n}",
                dedupe_key=f"{self.config.label}-{n}"))
            try:
                await asyncio.wait_for(stop.wait(), self.config.interval_seconds)
            except TimeoutError:
                pass


class Crasher:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = contract.EmptyConfig
    attempts: ClassVar[list[float]] = []

    def __init__(self, name: str, config: BaseModel, context: contract.DetectorContext) -> None:
        pass

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        self.attempts.append(asyncio.get_running_loop().time())
        raise RuntimeError("sensor on fire")


class Missing:
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = contract.EmptyConfig

    def __init__(self, name: str, config: BaseModel, context: contract.DetectorContext) -> None:
        pass

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        raise errors.DetectorUnavailableError("no GPU on this node")


class AgentOnly(Ticker):
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.AGENT})
