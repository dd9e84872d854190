from __future__ import annotations

import asyncio

import pydantic
import pytest
from prometheus_client import CollectorRegistry

from kcover import bus, model


def ev(i: int, *, key: str = "") -> model.CollectorEvent:
    return model.CollectorEvent(detector="t", target=model.Target(kind=model.TargetKind.NODE, name=f"n{i}"),
                                severity=model.Severity.ERROR, reason="Test", message=str(i), dedupe_key=key)


async def test_every_subscriber_gets_every_event_in_order() -> None:
    b = bus.Bus(dedupe_window_seconds=0)
    subs = [b.subscribe(f"s{i}") for i in range(4)]
    for i in range(100):
        await b.publish(ev(i))
    for sub in subs:
        got = sub.get_nowait()
        assert [e.message for e in got] == [str(i) for i in range(100)]


async def test_async_iteration_ends_after_close_and_drains_what_was_queued() -> None:
    b = bus.Bus(dedupe_window_seconds=0)
    sub = b.subscribe("consumer")
    received: list[str] = []

    async def consume() -> None:
        async for e in sub:
            received.append(e.message)

    task = asyncio.create_task(consume())
    for i in range(5):
        b.publish_nowait(ev(i))
    await b.close(drain_timeout_seconds=1)
    await asyncio.wait_for(task, 1)
    assert received == ["0", "1", "2", "3", "4"]
    with pytest.raises(bus.BusClosedError):
        b.publish_nowait(ev(9))


@pytest.mark.looptime
async def test_get_batch_ends_on_stop_or_timeout_and_loses_no_event() -> None:
    loop = asyncio.get_running_loop()
    b = bus.Bus(dedupe_window_seconds=0)
    sub = b.subscribe("consumer")
    stop = asyncio.Event()
    start = loop.time()
    assert await sub.get_batch(stop=stop, timeout=5.0) == []  # the timeout: nothing came
    assert loop.time() - start == pytest.approx(5.0)
    loop.call_later(2.0, stop.set)
    assert await sub.get_batch(stop=stop) == []  # stopped
    assert loop.time() - start == pytest.approx(7.0)
    assert not sub.drained
    b.publish_nowait(ev(1))
    assert [e.message for e in await sub.get_batch(stop=stop)] == ["1"]  # queued events come before a stop
    stop.clear()
    loop.call_later(1.0, b.publish_nowait, ev(2))
    assert [e.message for e in await sub.get_batch(stop=stop, timeout=60.0)] == ["2"]
    assert loop.time() - start == pytest.approx(8.0)
    await b.close(drain_timeout_seconds=0)
    assert sub.drained
    assert await sub.get_batch(stop=stop, timeout=60.0) == []
    assert loop.time() - start == pytest.approx(8.0)  # closed and drained: at once


async def test_drop_oldest_keeps_newest_and_counts_drops() -> None:
    b = bus.Bus(dedupe_window_seconds=0)
    sub = b.subscribe("slow", capacity=3, overflow=bus.Overflow.DROP_OLDEST)
    for i in range(10):
        b.publish_nowait(ev(i))
    assert [e.message for e in sub.get_nowait()] == ["7", "8", "9"]
    assert sub.counters.dropped == 7


async def test_drop_newest_keeps_queued_events() -> None:
    b = bus.Bus(dedupe_window_seconds=0)
    sub = b.subscribe("slow", capacity=3, overflow=bus.Overflow.DROP_NEWEST)
    for i in range(10):
        b.publish_nowait(ev(i))
    assert [e.message for e in sub.get_nowait()] == ["0", "1", "2"]
    assert sub.counters.dropped == 7


@pytest.mark.looptime
async def test_block_waits_for_space_then_gives_up_after_the_timeout() -> None:
    b = bus.Bus(dedupe_window_seconds=0, block_timeout_seconds=2.0)
    sub = b.subscribe("blocking", capacity=1, overflow=bus.Overflow.BLOCK)
    await b.publish(ev(0))

    async def take_later() -> None:
        await asyncio.sleep(1)
        sub.get_nowait()

    taker = asyncio.create_task(take_later())
    await b.publish(ev(1))  # waits about 1 s for the taker
    await taker
    assert [e.message for e in sub.get_nowait()] == ["1"]
    await b.publish(ev(2))
    loop = asyncio.get_running_loop()
    start = loop.time()
    await b.publish(ev(3))  # nobody takes: dropped after the 2 s timeout
    assert loop.time() - start == pytest.approx(2.0, abs=0.1)
    assert sub.counters.dropped == 1
    assert [e.message for e in sub.get_nowait()] == ["2"]


async def test_slow_block_subscriber_does_not_starve_others() -> None:
    b = bus.Bus(dedupe_window_seconds=0, block_timeout_seconds=0.01)
    fast = b.subscribe("fast", capacity=100)
    b.subscribe("stuck", capacity=1, overflow=bus.Overflow.BLOCK)
    for i in range(5):
        await b.publish(ev(i))
    assert len(fast.get_nowait()) == 5


@pytest.mark.looptime
async def test_dedupe_within_window_only() -> None:
    loop = asyncio.get_running_loop()
    b = bus.Bus(dedupe_window_seconds=10, clock=loop.time)
    sub = b.subscribe("s")
    assert b.publish_nowait(ev(1, key="same"))
    assert not b.publish_nowait(ev(2, key="same"))
    assert b.publish_nowait(ev(3, key="other"))
    await asyncio.sleep(11)
    assert b.publish_nowait(ev(4, key="same"))
    assert [e.message for e in sub.get_nowait()] == ["1", "3", "4"]
    assert b.deduped == 1
    assert b.published == 3


async def test_default_dedupe_key_names_detector_reason_and_target() -> None:
    b = bus.Bus(dedupe_window_seconds=60)
    sub = b.subscribe("s")
    b.publish_nowait(ev(1))
    b.publish_nowait(ev(1))  # same target, reason, detector
    b.publish_nowait(ev(2))
    assert len(sub.get_nowait()) == 2


async def test_collector_exports_counters() -> None:
    b = bus.Bus(dedupe_window_seconds=0)
    sub = b.subscribe("s", capacity=1, overflow=bus.Overflow.DROP_NEWEST)
    b.publish_nowait(ev(1))
    b.publish_nowait(ev(2))
    registry = CollectorRegistry()
    registry.register(bus.BusCollector(b))
    assert registry.get_sample_value("kcover_bus_published_total") == 2
    assert registry.get_sample_value("kcover_bus_dropped_total", {"subscriber": "s"}) == 1
    assert registry.get_sample_value("kcover_bus_queue_depth", {"subscriber": "s"}) == 1
    sub.get_nowait()
    assert registry.get_sample_value("kcover_bus_delivered_total", {"subscriber": "s"}) == 1


def test_events_are_frozen_and_messages_bounded() -> None:
    e = model.CollectorEvent(detector="d", target=model.Target(kind=model.TargetKind.POD, namespace="a", name="b"),
                             severity=model.Severity.WARNING, reason="R", message="x" * 5000)
    assert len(e.message) == model.MESSAGE_MAX
    with pytest.raises(pydantic.ValidationError):
        e.reason = "other"  # type: ignore[misc]
    with pytest.raises(ValueError):
        model.CollectorEvent(detector="d", target=e.target, severity=model.Severity.ERROR, reason="")
