"""Third-party detectors run isolated: blocking, flooding, raising or ignoring stop costs the process nothing.

Real time, real threads (no looptime: the plugins' loops run on threads of their own). Each test asserts
what a user would see — what the bus delivered, what `kcover_detector_dropped` counts, what the
supervisor reports — never how long something took.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from kcover import bus as bus_
from kcover import metrics, model, settings
from kcover.detectors import contract, isolating, registry, supervising

from . import detectors_for_tests as d


def plugins() -> registry.Registry:
    def info(name: str, cls: type, dist: str = "kcover-test-plugins") -> registry.DetectorInfo:
        return registry.DetectorInfo(name, f"x:{cls.__name__}", dist, "0", cls)  # type: ignore[arg-type]

    return registry.Registry([info("flooder", d.Flooder), info("sleeper", d.Sleeper), info("stubborn", d.Stubborn),
                              info("echo", d.Echo), info("crasher", d.Crasher), info("reader", d.Reader),
                              info("ticker", d.Ticker, registry.BUILTIN_DISTRIBUTION)])


class Rig:
    def __init__(self, entries: Mapping[str, Any], *, context: Mapping[str, Any] | None = None, **extra: Any) -> None:
        self.metrics = metrics.Metrics()
        self.bus = bus_.Bus(dedupe_window_seconds=0)
        self.seen = self.bus.subscribe("test")
        ctx = contract.DetectorContext(role=contract.Role.CONTROLLER, metrics=self.metrics, **(context or {}))
        # the registry decides who is isolated: the plugins are, the ticker (built in) is not
        cfg = settings.DetectorsSettings.model_validate(
            {"entries": {**{n: {"enabled": False} for n in settings.BUILTIN_DETECTORS}, **entries}, **extra})
        self.sup = supervising.Supervisor(plugins(), ctx, self.bus, cfg, self.metrics)
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.sup.run(self.stop), name="supervisor")

    def dropped(self, detector: str, reason: str) -> float:
        return self.metrics.registry.get_sample_value("kcover_detector_dropped_total",
                                                      {"detector": detector, "reason": reason}) or 0.0

    async def first(self, reason: str, timeout: float = 10.0) -> model.CollectorEvent:
        async with asyncio.timeout(timeout):
            while True:
                for event in await self.seen.get_batch():
                    if event.reason == reason:
                        return event


@pytest.fixture
async def rigs() -> AsyncIterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        rig.stop.set()
        if rig.task is not None:
            await asyncio.wait_for(rig.task, 10)


def rig_of(rigs: list[Rig], entries: Mapping[str, Any], *, context: Mapping[str, Any] | None = None,
           **extra: Any) -> Rig:
    rig = Rig(entries, context=context, **extra)
    rigs.append(rig)
    rig.start()
    return rig


async def test_a_blocking_plugin_does_not_stall_the_built_in_detectors(rigs: list[Rig]) -> None:
    d.Sleeper.sleeping[0] = False
    rig = rig_of(rigs, {"sleeper": {"config": {"block_seconds": 3.0}}, "ticker": {"config": {"interval_seconds": 0.05}}},
                 stop_grace_seconds=0.5)
    async with asyncio.timeout(5):
        while not d.Sleeper.sleeping[0]:  # noqa: ASYNC110  (polling a flag another thread sets)
            await asyncio.sleep(0.01)
    rig.seen.get_nowait()
    for _ in range(3):
        await rig.first("Tick")
    assert d.Sleeper.sleeping[0], "the built-in detector's events arrived while the plugin was still blocked"
    assert rig.sup.describe()["sleeper"]["isolated"] is True


async def test_a_flooding_plugin_is_rate_limited_and_its_drops_are_counted(rigs: list[Rig]) -> None:
    d.Flooder.done.clear()
    rig = rig_of(rigs, {"flooder": {"config": {"events": 100_000}}, "ticker": {"config": {"interval_seconds": 0.05}}},
                 plugin_rate_per_second=100.0, plugin_burst=500, plugin_queue_capacity=200)
    await rig.first("Tick")
    async with asyncio.timeout(30):
        while not d.Flooder.done:  # noqa: ASYNC110  (polling a flag another thread sets)
            await asyncio.sleep(0.05)
    await rig.first("Tick")  # the built-in detector still gets through
    dropped = rig.dropped("flooder", "rate_limited") + rig.dropped("flooder", "queue_full")
    assert dropped > 90_000
    await asyncio.sleep(0.2)
    flood = sum(1 for e in rig.seen.get_nowait() if e.reason == "Flood")
    assert rig.bus.published - flood >= 1
    forwarded = rig.sup._running["flooder"]
    assert forwarded.isolated


async def test_a_raising_plugin_is_restarted_and_its_error_reported(rigs: list[Rig]) -> None:
    d.Crasher.attempts.clear()
    rig = rig_of(rigs, {"crasher": {}}, restart_initial_seconds=0.05, restart_max_seconds=0.1)
    async with asyncio.timeout(10):
        # restarted (three attempts) and, between attempts, reported failed: the plugin's thread records an
        # attempt before it raises, so right after the third the supervisor may not have seen it fail yet
        while len(d.Crasher.attempts) < 3 or rig.sup.health()["crasher"] != "failed":  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    assert "RuntimeError: sensor on fire" in rig.sup.describe()["crasher"]["detail"]  # type: ignore[operator]
    assert rig.sup.readiness()[0], "an optional plugin's failure leaves the process ready"


async def test_a_plugin_that_ignores_stop_is_abandoned_after_the_grace(rigs: list[Rig]) -> None:
    rig = rig_of(rigs, {"stubborn": {}, "ticker": {"config": {"interval_seconds": 0.05}}}, stop_grace_seconds=0.3)
    await rig.first("Tick")
    threads = [t for t in threading.enumerate() if t.name == "kcover-detector-stubborn"]
    assert len(threads) == 1
    rig.stop.set()
    assert rig.task is not None
    await asyncio.wait_for(rig.task, 10)  # the supervisor returned although the plugin never did
    assert threads[0].is_alive()
    assert threads[0].daemon, "left behind as a daemon thread: exit is not held up"
    assert rig.sup.health()["stubborn"] == "stopped"


async def test_a_subscribing_plugin_sees_the_bus_and_publishes_back(rigs: list[Rig]) -> None:
    rig = rig_of(rigs, {"echo": {}, "ticker": {"config": {"interval_seconds": 0.05}}})
    echo = await rig.first("Echo")
    assert echo.detector == "echo"
    assert rig.sup.describe()["echo"]["isolated"] is True
    assert rig.sup.describe()["ticker"]["isolated"] is False


class MainLoopReads:
    """A log reader and a pod lookup that note the thread and loop each call runs on."""

    def __init__(self) -> None:
        self.ran_on: list[tuple[int, asyncio.AbstractEventLoop]] = []

    async def read_log(self, namespace: str, pod: str, container: str, *, previous: bool, tail_lines: int,
                       limit_bytes: int) -> str:
        self.ran_on.append((threading.get_ident(), asyncio.get_running_loop()))
        return f"log of {namespace}/{pod}/{container}"

    async def pods_for_devices(self, device_ids: list[str]) -> list[str]:
        self.ran_on.append((threading.get_ident(), asyncio.get_running_loop()))
        return [f"ml/holder-of-{d}" for d in device_ids]


async def test_a_plugins_reads_run_on_the_main_loop_and_its_state_outlives_a_restart(rigs: list[Rig]) -> None:
    reads = MainLoopReads()
    rig = rig_of(rigs, {"reader": {"enabled": True}}, context={"log_reader": reads, "pod_lookup": reads},
                 restart_initial_seconds=0.05)
    first = await rig.first("Read")
    assert first.message == "log of ml/bert-0/trainer|ml/holder-of-GPU-1|1"
    again = await rig.first("Read")  # restarted after its first run failed, on a new thread and loop
    assert again.message.endswith("|2")  # the kept state is the one the first run made
    main = (threading.get_ident(), asyncio.get_running_loop())
    assert reads.ran_on == [main] * 4  # both calls of both runs, none on the plugin's own loop
    assert rig.sup.describe()["reader"]["isolated"] is True


def test_the_bridge_refuses_past_its_rate_and_queue_and_after_close() -> None:
    loop = asyncio.new_event_loop()
    try:
        now = [0.0]
        bridge = isolating.Bridge(bus_.Bus(), loop, "p", isolating.Limits(rate_per_second=10, burst=3, queue_capacity=2),
                                  metrics.Metrics().detector_dropped, clock=lambda: now[0])
        event = d._event("p", 1)
        assert [bridge.offer(event) for _ in range(3)] == [True, True, False]  # the queue holds 2
        assert bridge.drops == {"queue_full": 1}
        bridge._queue.clear()
        assert bridge.offer(event) is True  # the third token
        assert bridge.offer(event) is False
        assert bridge.drops["rate_limited"] == 1
        now[0] += 0.1  # one token back at 10/s
        bridge._queue.clear()
        assert bridge.offer(event) is True
        bridge.close()
        assert bridge.offer(event) is False
        assert bridge.drops["closed"] == 1
    finally:
        loop.close()
