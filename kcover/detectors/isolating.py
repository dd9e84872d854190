"""Running a third-party detector in its own thread and event loop, behind a bounded bridge to the bus.

Owns the isolation of plugins: the detector is built and run on a loop of its own, in a daemon thread,
so a plugin that blocks with synchronous calls (`time.sleep`, a blocking socket) stalls only itself,
never the process's loop, its Lease renewals or the other detectors. What it publishes crosses a
`Bridge`: a token bucket (`detectors.plugin_rate_per_second`, `plugin_burst`) and a bounded queue
(`plugin_queue_capacity`) on the plugin's side, drained onto the real bus by the main loop in slices,
so a plugin that floods costs the main loop a bounded amount of work; what is refused is counted per
detector in `kcover_detector_dropped{detector,reason}`. A plugin that subscribes gets a subscription
on a bus of its own loop, fed from the real bus. The context's log reader and pod lookup run on the
main loop, whose connections they use (`context_for`).

It does not restart or judge detectors (`supervising` does). How it fails: what the detector raises is
raised by `run()` in the main loop. A detector that does not return within `stop_grace_seconds` of
being asked to stop is abandoned: `run()` returns, its thread (a daemon) is left behind and can no
longer publish, and the process may exit without it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from prometheus_client import Counter

from kcover import bus as bus_
from kcover import model
from kcover.detectors import contract

log = structlog.get_logger()

DRAIN_SLICE = 256
"""Events moved onto the bus per turn of the main loop; the rest wait for the next turn."""


@dataclass(frozen=True)
class Limits:
    """How much one isolated detector may publish."""

    rate_per_second: float = 100.0
    burst: int = 1000
    queue_capacity: int = 1000
    stop_grace_seconds: float = 5.0


class Bridge:
    """Plugin thread -> main loop: rate-limited, bounded; `offer()` never blocks and is safe from any thread."""

    def __init__(self, bus: bus_.Bus, loop: asyncio.AbstractEventLoop, name: str, limits: Limits,
                 dropped: Counter, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._bus = bus
        self._loop = loop
        self.name = name
        self._limits = limits
        self._dropped = dropped
        self._clock = clock
        self._queue: collections.deque[model.CollectorEvent] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._tokens = float(limits.burst)
        self._refilled = clock()
        self.closed = False
        self.forwarded = 0
        self.drops: collections.Counter[str] = collections.Counter()

    def _drop(self, reason: str) -> bool:
        self.drops[reason] += 1
        self._dropped.labels(detector=self.name, reason=reason).inc()
        return False

    def offer(self, event: model.CollectorEvent) -> bool:
        """Queue `event` for the bus; False (and counted) when over the rate, the queue is full, or closed."""
        limits = self._limits
        with self._lock:
            if self.closed:
                return self._drop("closed")
            now = self._clock()
            self._tokens = min(float(limits.burst), self._tokens + (now - self._refilled) * limits.rate_per_second)
            self._refilled = now
            if self._tokens < 1.0:
                return self._drop("rate_limited")
            if len(self._queue) >= limits.queue_capacity:
                return self._drop("queue_full")
            self._tokens -= 1.0
            self._queue.append(event)
            if self._scheduled:
                return True
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the main loop is closed: the process is exiting
            return self._drop("closed")
        return True

    def _drain(self) -> None:
        """Main loop: move one slice onto the bus; reschedule while more is queued."""
        bus = self._bus
        for _ in range(DRAIN_SLICE):
            try:
                event = self._queue.popleft()
            except IndexError:
                break
            if bus.closed:
                self._drop("closed")
                continue
            bus.publish_nowait(event)
            self.forwarded += 1
        with self._lock:
            if self._queue and not self.closed:
                self._loop.call_soon(self._drain)
            else:
                self._scheduled = False

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._queue.clear()


T = TypeVar("T")


def _on_loop(work: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> Awaitable[T]:
    """`work` run on `loop` (kcover's main loop), awaited from the plugin's own."""
    return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))


@dataclass(frozen=True)
class _LogReaderOnMainLoop:
    """The context's log reader seen from a plugin's loop: each read runs on the main loop."""

    reader: contract.LogReader
    loop: asyncio.AbstractEventLoop

    async def read_log(self, namespace: str, pod: str, container: str, *, previous: bool, tail_lines: int,
                       limit_bytes: int) -> str:
        return await _on_loop(self.reader.read_log(namespace, pod, container, previous=previous,
                                                   tail_lines=tail_lines, limit_bytes=limit_bytes), self.loop)


@dataclass(frozen=True)
class _PodLookupOnMainLoop:
    """The context's pod lookup seen from a plugin's loop: each lookup runs on the main loop."""

    lookup: contract.PodLookup
    loop: asyncio.AbstractEventLoop

    async def pods_for_devices(self, device_ids: Sequence[str]) -> list[str]:
        return await _on_loop(self.lookup.pods_for_devices(list(device_ids)), self.loop)


def context_for(context: contract.DetectorContext, loop: asyncio.AbstractEventLoop) -> contract.DetectorContext:
    """The context an isolated detector gets: the same, but for the log reader and the pod lookup, whose
    connections belong to `loop` (the main loop), proxied onto it. The kept state is shared."""
    return dataclasses.replace(
        context,
        log_reader=None if context.log_reader is None else _LogReaderOnMainLoop(context.log_reader, loop),
        pod_lookup=None if context.pod_lookup is None else _PodLookupOnMainLoop(context.pod_lookup, loop))


class PluginBus:
    """What an isolated detector is handed as its bus: publishing goes through the bridge, subscribing to
    a bus of the plugin's own loop that the real bus feeds."""

    def __init__(self, bridge: Bridge, inbound: Callable[[str, int, bus_.Overflow], bus_.Subscription]) -> None:
        self._bridge = bridge
        self._inbound = inbound

    @property
    def closed(self) -> bool:
        return self._bridge.closed

    def publish_nowait(self, event: model.CollectorEvent) -> bool:
        return self._bridge.offer(event)

    async def publish(self, event: model.CollectorEvent) -> bool:
        return self._bridge.offer(event)

    def subscribe(self, name: str, *, capacity: int = 10_000,
                  overflow: bus_.Overflow = bus_.Overflow.DROP_OLDEST) -> bus_.Subscription:
        return self._inbound(name, capacity, overflow)


class Isolated:
    """One run of a detector in its own thread and loop; `run()` is awaited on the main loop."""

    def __init__(self, name: str, build: Callable[[], Any], bus: bus_.Bus, limits: Limits, dropped: Counter) -> None:
        self.name = name
        self._build = build
        self._bus = bus
        self._limits = limits
        self._dropped = dropped
        self.bridge: Bridge | None = None
        self.thread: threading.Thread | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Run the detector until it returns or raises (re-raised here), or until `stop` plus the grace."""
        main = asyncio.get_running_loop()
        bridge = self.bridge = Bridge(self._bus, main, self.name, self._limits, self._dropped)
        finished: asyncio.Future[BaseException | None] = main.create_future()
        ready = threading.Event()
        box: dict[str, Any] = {}
        forwarders: list[asyncio.Task[None]] = []

        def inbound(sub_name: str, capacity: int, overflow: bus_.Overflow) -> bus_.Subscription:
            """Called on the plugin's loop: a local subscription fed from the real bus."""
            local: bus_.Bus = box["local"]
            sub = local.subscribe(sub_name, capacity=capacity, overflow=overflow)
            main.call_soon_threadsafe(lambda: forwarders.append(main.create_task(
                self._forward(box["loop"], local, capacity, stop), name=f"detector:{self.name}:inbound")))
            return sub

        def resolve(outcome: BaseException | None) -> None:
            if not finished.done():
                finished.set_result(outcome)

        def thread_main() -> None:
            loop = asyncio.new_event_loop()
            box["loop"] = loop
            box["local"] = bus_.Bus(dedupe_window_seconds=0.0)
            box["stop"] = asyncio.Event()
            ready.set()
            outcome: BaseException | None = None
            try:
                detector = self._build()
                loop.run_until_complete(detector.run(PluginBus(bridge, inbound), box["stop"]))
            except BaseException as exc:  # carried to the main loop and raised there
                outcome = exc
            finally:
                with contextlib.suppress(RuntimeError):
                    main.call_soon_threadsafe(resolve, outcome)
                with contextlib.suppress(Exception):
                    loop.close()

        self.thread = threading.Thread(target=thread_main, name=f"kcover-detector-{self.name}", daemon=True)
        self.thread.start()
        await asyncio.to_thread(ready.wait)
        plugin_loop: asyncio.AbstractEventLoop = box["loop"]
        stopper: asyncio.Future[Any] = main.create_task(stop.wait(), name=f"detector:{self.name}:stop")
        waited: set[asyncio.Future[Any]] = {finished, stopper}
        try:
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            if not finished.done():
                self._ask_to_stop(plugin_loop, box)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(finished), self._limits.stop_grace_seconds)
                if not finished.done():
                    log.warning("detector_abandoned", detector=self.name,
                                grace_seconds=self._limits.stop_grace_seconds)
                    return
            outcome = finished.result()
        except asyncio.CancelledError:
            self._ask_to_stop(plugin_loop, box)
            raise
        finally:
            stopper.cancel()
            bridge.close()
            for task in forwarders:
                task.cancel()
        if outcome is not None:
            raise outcome

    @staticmethod
    def _ask_to_stop(plugin_loop: asyncio.AbstractEventLoop, box: dict[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # its loop already closed
            plugin_loop.call_soon_threadsafe(box["stop"].set)

    async def _forward(self, plugin_loop: asyncio.AbstractEventLoop, local: bus_.Bus, capacity: int,
                       stop: asyncio.Event) -> None:
        """Main loop: hand what the real bus delivers to the plugin's own bus, in batches."""
        sub = self._bus.subscribe(f"plugin:{self.name}", capacity=capacity, overflow=bus_.Overflow.DROP_OLDEST)
        try:
            while not stop.is_set():
                batch = await sub.get_batch()
                if not batch:
                    return
                try:
                    plugin_loop.call_soon_threadsafe(_publish_all, local, batch)
                except RuntimeError:
                    return  # the plugin's loop ended
        finally:
            sub.unsubscribe()


def _publish_all(local: bus_.Bus, batch: list[model.CollectorEvent]) -> None:
    for event in batch:
        with contextlib.suppress(bus_.BusClosedError):
            local.publish_nowait(event)
