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

    def __init__(self, name: str, config: TickConfig, context: contract.DetectorContext) -> None:
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
            await contract.sleep_or_stop(stop, self.config.interval_seconds)


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


class Appearing:
    """Unavailable on its first `unavailable_for` attempts (a driver not loaded yet), then runs until stopped."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = contract.EmptyConfig
    unavailable_for: ClassVar[int] = 2
    attempts: ClassVar[list[float]] = []

    def __init__(self, name: str, config: BaseModel, context: contract.DetectorContext) -> None:
        pass

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        self.attempts.append(asyncio.get_running_loop().time())
        if len(self.attempts) <= self.unavailable_for:
            await asyncio.sleep(0.01)  # finding out takes a moment: the supervisor says "running" meanwhile
            raise errors.DetectorUnavailableError("driver not loaded")
        await stop.wait()


class AgentOnly(Ticker):
    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.AGENT})


# ------------------------------------------------------------------------------ misbehaving plugins

class MisbehaviourConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    events: int = 1_000_000
    """Flooder: how many events it publishes, as fast as it can."""
    block_seconds: float = 12.0
    """Sleeper: how long each synchronous `time.sleep` blocks its loop."""


def _event(detector: str, n: int) -> model.CollectorEvent:
    return model.CollectorEvent(detector=detector, target=model.Target(kind=model.TargetKind.NODE, name="n"),
                                severity=model.Severity.INFO, reason="Flood", message=str(n), dedupe_key=f"{detector}-{n}")


class Flooder:
    """Publishes `events` events in a tight loop, then idles until stopped."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = MisbehaviourConfig
    done: ClassVar[list[int]] = []

    def __init__(self, name: str, config: MisbehaviourConfig, context: contract.DetectorContext) -> None:
        self.name, self.config = name, config

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        for n in range(self.config.events):
            bus.publish_nowait(_event(self.name, n))
            if n % 10_000 == 0:
                await asyncio.sleep(0)
        self.done.append(self.config.events)
        await stop.wait()


class Sleeper:
    """Blocks its own loop with synchronous `time.sleep` calls until stopped (checks stop in between)."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = MisbehaviourConfig
    sleeping: ClassVar[list[bool]] = [False]

    def __init__(self, name: str, config: MisbehaviourConfig, context: contract.DetectorContext) -> None:
        self.config = config

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        import time

        while not stop.is_set():
            self.sleeping[0] = True
            time.sleep(self.config.block_seconds)  # noqa: ASYNC251  (the misbehaviour under test)
            self.sleeping[0] = False
            await asyncio.sleep(0)


class Stubborn:
    """Ignores stop: blocks forever in a synchronous call."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = contract.EmptyConfig

    def __init__(self, name: str, config: BaseModel, context: contract.DetectorContext) -> None:
        pass

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        import threading

        threading.Event().wait()  # never set, never returns


class Echo:
    """Subscribes to the bus and republishes every Tick as an Echo (as logscan derives events from others)."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = contract.EmptyConfig

    def __init__(self, name: str, config: BaseModel, context: contract.DetectorContext) -> None:
        self.name = name

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        sub = bus.subscribe(self.name)
        try:
            while batch := await sub.get_batch(stop=stop):
                for event in batch:
                    if event.reason == "Tick":
                        await bus.publish(model.CollectorEvent(
                            detector=self.name, target=event.target, severity=event.severity, reason="Echo",
                            message=event.message, dedupe_key=f"echo-{event.message}"))
        finally:
            sub.unsubscribe()


class Reader:
    """Reads a log and asks which pods hold a device through its context, and counts its starts in the state
    its context keeps; fails its first run. Publishes `Read` with what it got: `<log>|<pods>|<starts>`."""

    roles: ClassVar[frozenset[contract.Role]] = frozenset({contract.Role.CONTROLLER})
    config_model: ClassVar[type[BaseModel]] = contract.EmptyConfig

    def __init__(self, name: str, config: contract.EmptyConfig, context: contract.DetectorContext) -> None:
        self.name = name
        self.context = context

    async def run(self, bus: bus_.Bus, stop: asyncio.Event) -> None:
        starts: list[int] = self.context.state(self.name, list)
        starts.append(len(starts) + 1)
        reader, lookup = self.context.log_reader, self.context.pod_lookup
        if reader is None or lookup is None:
            raise errors.DetectorUnavailableError("reader needs a log reader and a pod lookup")
        text = await reader.read_log("ml", "bert-0", "trainer", previous=False, tail_lines=10, limit_bytes=1024)
        pods = await lookup.pods_for_devices(["GPU-1"])
        bus.publish_nowait(model.CollectorEvent(
            detector=self.name, target=model.Target(kind=model.TargetKind.NODE, name="n"),
            severity=model.Severity.INFO, reason="Read", message=f"{text}|{','.join(pods)}|{len(starts)}",
            dedupe_key=f"read-{len(starts)}"))
        if len(starts) == 1:
            raise RuntimeError("the first run fails")
        await stop.wait()
