"""The in-process event bus between detectors and consumers.

Owns fan-out of `CollectorEvent`s to many subscribers, each with a bounded queue and an explicit
overflow policy, ordered delivery per subscriber, dedupe of equal keys within a window, graceful
drain on shutdown, and counters exported to Prometheus at scrape time (no per-event lock cost).
It does not persist anything: a process that dies loses what was queued, and detectors re-observe
faults that still hold.

Failure modes: a full queue never blocks a publisher for longer than `block_timeout_seconds`; what
is dropped is counted per subscriber and logged (at most once per second per subscriber).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kcover import model
from kcover.aio import waiting

log = structlog.get_logger()


class Overflow(enum.StrEnum):
    DROP_OLDEST = "drop_oldest"
    """Keep the newest events: right for consumers that act on current state."""
    DROP_NEWEST = "drop_newest"
    """Keep what is queued and refuse the new event."""
    BLOCK = "block"
    """Make the publisher wait, up to the bus's block timeout, then drop the new event."""


class BusClosedError(RuntimeError):
    """Publishing on a bus that is shutting down."""


_CLOSED = object()


@dataclass
class _Counters:
    delivered: int = 0
    dropped: int = 0
    last_drop_log: float = 0.0


class Subscription:
    """One consumer's view of the bus: an ordered, bounded queue of events."""

    def __init__(self, bus: Bus, name: str, capacity: int, overflow: Overflow) -> None:
        self._bus = bus
        self.name = name
        self.capacity = capacity
        self.overflow = overflow
        self._queue: collections.deque[model.CollectorEvent] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._space: asyncio.Event | None = None
        self._closed = False
        self.counters = _Counters()

    @property
    def depth(self) -> int:
        return len(self._queue)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None  # one wake-up per wait, however many events arrive before the consumer runs
            if not waiter.done():
                waiter.set_result(None)

    def _offer(self, event: model.CollectorEvent) -> bool:
        """Enqueue without waiting. Returns False when the event had to be dropped."""
        queue = self._queue
        if len(queue) < self.capacity:
            queue.append(event)
            self._wake()
            return True
        if self.overflow is Overflow.DROP_OLDEST:
            queue.popleft()
            queue.append(event)
            self._note_drop()
            self._wake()
            return True
        self._note_drop()
        return False

    async def _put_blocking(self, event: model.CollectorEvent, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self._queue) >= self.capacity and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._note_drop()
                return
            if self._space is None:
                self._space = asyncio.Event()
            self._space.clear()
            try:
                await asyncio.wait_for(self._space.wait(), remaining)
            except TimeoutError:
                self._note_drop()
                return
        self._queue.append(event)
        self._wake()

    def _note_drop(self) -> None:
        counters = self.counters
        counters.dropped += 1
        now = time.monotonic()
        if now - counters.last_drop_log >= 1.0:
            counters.last_drop_log = now
            log.warning("bus_event_dropped", subscriber=self.name, policy=self.overflow.value,
                        capacity=self.capacity, dropped_total=counters.dropped)

    def _close(self) -> None:
        self._closed = True
        self._wake()
        if self._space is not None:
            self._space.set()

    def get_nowait(self) -> list[model.CollectorEvent]:
        """Take everything queued now, in order."""
        items = list(self._queue)
        self._queue.clear()
        self.counters.delivered += len(items)
        if self._space is not None:
            self._space.set()
        return items

    @property
    def drained(self) -> bool:
        """The bus closed and nothing is left here: `get_batch` returns [] from now on."""
        return self._closed and not self._queue

    async def get_batch(self, *, stop: asyncio.Event | None = None,
                        timeout: float | None = None) -> list[model.CollectorEvent]:
        """Wait for at least one event and take all that are queued. [] when the bus closed and this queue
        drained (`drained`), when `stop` is set first, or when `timeout` seconds pass first. Events are
        taken only by a call that returns them: a wait that is cancelled, stopped or timed out loses none."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._queue:
            if self._closed or (stop is not None and stop.is_set()):
                return []
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return []
            waiter = self._waiter = loop.create_future()
            try:
                if stop is None and left is None:
                    await waiter
                else:
                    await waiting.or_stop(waiter, stop or asyncio.Event(), timeout=left)
            finally:
                self._waiter = None
        return self.get_nowait()

    async def __aiter__(self) -> AsyncIterator[model.CollectorEvent]:
        while True:
            batch = await self.get_batch()
            if not batch:
                return
            for event in batch:
                yield event

    def unsubscribe(self) -> None:
        self._bus._remove(self)
        self._close()


@dataclass
class _Dedupe:
    window: float
    seen: dict[str, float] = field(default_factory=dict)
    order: collections.deque[tuple[float, str]] = field(default_factory=collections.deque)

    def admit(self, key: str, now: float) -> bool:
        order = self.order
        seen = self.seen
        while order and order[0][0] <= now:
            expires, old = order.popleft()
            if seen.get(old) == expires:
                del seen[old]
        previous = seen.get(key)
        if previous is not None and previous > now:
            return False
        expires = now + self.window
        seen[key] = expires
        order.append((expires, key))
        return True


class Bus:
    """Fan-out of events to subscribers. Create one per process; pass it to detectors and consumers."""

    def __init__(self, *, dedupe_window_seconds: float = 5.0, block_timeout_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._subs: list[Subscription] = []
        self._dedupe = _Dedupe(dedupe_window_seconds)
        self.block_timeout_seconds = block_timeout_seconds
        self._clock = clock
        self._closed = False
        self.published = 0
        self.deduped = 0

    def configure(self, *, dedupe_window_seconds: float, block_timeout_seconds: float) -> None:
        """Apply new tunables live (hot reload)."""
        self._dedupe.window = dedupe_window_seconds
        self.block_timeout_seconds = block_timeout_seconds

    @property
    def closed(self) -> bool:
        return self._closed

    def subscribe(self, name: str, *, capacity: int = 10_000,
                  overflow: Overflow = Overflow.DROP_OLDEST) -> Subscription:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        sub = Subscription(self, name, capacity, overflow)
        if self._closed:
            sub._close()
        self._subs.append(sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        return tuple(self._subs)

    def _admit(self, event: model.CollectorEvent) -> bool:
        if self._closed:
            raise BusClosedError("the bus is shutting down")
        if self._dedupe.window > 0 and not self._dedupe.admit(event.dedupe_key or event.key, self._clock()):
            self.deduped += 1
            return False
        self.published += 1
        return True

    def publish_nowait(self, event: model.CollectorEvent) -> bool:
        """Publish without waiting: BLOCK subscribers that are full drop the event. False if deduped."""
        if not self._admit(event):
            return False
        for sub in self._subs:
            queue = sub._queue
            if len(queue) < sub.capacity:  # the common case, inlined: this is the hot path
                queue.append(event)
                if sub._waiter is not None:
                    sub._wake()
            else:
                sub._offer(event)
        return True

    async def publish(self, event: model.CollectorEvent) -> bool:
        """Publish; waits (bounded) for BLOCK subscribers with a full queue. False if deduped."""
        if not self._admit(event):
            return False
        for sub in self._subs:
            if sub.overflow is Overflow.BLOCK and sub.depth >= sub.capacity:
                await sub._put_blocking(event, self.block_timeout_seconds)
            else:
                sub._offer(event)
        return True

    async def close(self, *, drain_timeout_seconds: float = 5.0) -> None:
        """Refuse new events, let subscribers drain what is queued (bounded), then end their iterators."""
        self._closed = True
        for sub in self._subs:
            sub._close()
        deadline = time.monotonic() + drain_timeout_seconds
        # consumers give no signal when they take events; a short poll bounds the drain
        while any(sub.depth for sub in self._subs) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        left = {sub.name: sub.depth for sub in self._subs if sub.depth}
        if left:
            log.warning("bus_drain_incomplete", undelivered=left)


class BusCollector(Collector):
    """Exports a bus's counters to Prometheus when scraped."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    def collect(self) -> Iterable[Metric]:
        bus = self._bus
        yield CounterMetricFamily("kcover_bus_published", "Events accepted by the bus.", value=bus.published)
        yield CounterMetricFamily("kcover_bus_deduped", "Events dropped as duplicates within the window.",
                                  value=bus.deduped)
        delivered = CounterMetricFamily("kcover_bus_delivered", "Events taken by a subscriber.",
                                        labels=["subscriber"])
        dropped = CounterMetricFamily("kcover_bus_dropped", "Events a full subscriber queue dropped.",
                                      labels=["subscriber"])
        depth = GaugeMetricFamily("kcover_bus_queue_depth", "Events waiting in a subscriber queue.",
                                  labels=["subscriber"])
        for sub in bus.subscriptions:
            delivered.add_metric([sub.name], sub.counters.delivered)
            dropped.add_metric([sub.name], sub.counters.dropped)
            depth.add_metric([sub.name], sub.depth)
        yield delivered
        yield dropped
        yield depth
